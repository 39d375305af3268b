"""`peloton server` settings: a TOML file, then PELOTON_* variables, then flags (the later wins); checked at start
with one line naming the file or variable and the key; --print-config shows the result."""

from __future__ import annotations

from pathlib import Path

import pytest

from peloton.cli import server_config
from peloton.cli.main import build_parser, main
from peloton.errors import InvalidArgument


def server_parser():  # type: ignore[no-untyped-def]
    return build_parser().parse_args(["server"]).server_parser


def effective(argv: list[str], env: dict[str, str]):  # type: ignore[no-untyped-def]
    p = server_parser()
    return p.parse_args(server_config.layered(p, argv, env))


def test_the_file_then_the_environment_then_the_flags(tmp_path: Path) -> None:
    f = tmp_path / "peloton.toml"
    f.write_text('listen = "127.0.0.1:6000"\nmetrics-listen = ""\nrate-limit = 20\ninsecure = true\n'
                 'task-env-allow = ["LD_LIBRARY_PATH", "NCCL_*"]\nbackend = "sim"\n')
    a = effective(["--config", str(f)], {})
    assert (a.listen, a.metrics_listen, a.rate_limit, a.insecure, a.task_env_allow, a.backend) == (
        "127.0.0.1:6000", "", 20.0, True, "LD_LIBRARY_PATH,NCCL_*", "sim")
    a = effective(["--config", str(f)], {"PELOTON_LISTEN": "127.0.0.1:7000", "PELOTON_RATE_LIMIT": "5"})
    assert (a.listen, a.rate_limit) == ("127.0.0.1:7000", 5.0)
    a = effective(["--config", str(f), "--listen", "127.0.0.1:8000"], {"PELOTON_LISTEN": "127.0.0.1:7000"})
    assert a.listen == "127.0.0.1:8000"
    a = effective([], {server_config.CONFIG_ENV: str(f), "PELOTON_STANDBY": "yes", "PELOTON_ADDRESS": "x:1"})
    assert a.listen == "127.0.0.1:6000" and a.standby  # PELOTON_ADDRESS is the CLI's: not a setting


def test_task_cgroups_is_a_setting_like_the_others(tmp_path: Path) -> None:
    f = tmp_path / "peloton.toml"
    f.write_text('task-cgroups = "off"\n')
    assert effective([], {}).task_cgroups == "auto"
    assert effective(["--config", str(f)], {}).task_cgroups == "off"
    assert effective([], {"PELOTON_TASK_CGROUPS": "off"}).task_cgroups == "off"
    assert effective(["--config", str(f), "--task-cgroups", "auto"], {}).task_cgroups == "auto"
    with pytest.raises(InvalidArgument, match="PELOTON_TASK_CGROUPS: must be one of auto, off, got 'no'"):
        effective([], {"PELOTON_TASK_CGROUPS": "no"})
    from peloton.settings import ServerConfig

    with pytest.raises(InvalidArgument, match="--task-cgroups: must be one of auto, off, got 'on'"):
        ServerConfig("127.0.0.1:0", None, tmp_path, task_cgroups="on").check()


def test_the_placement_engines_lease_comes_from_any_source_and_is_checked(tmp_path: Path) -> None:
    from peloton.settings import ServerConfig

    f = tmp_path / "peloton.toml"
    f.write_text("placement-engine-lease = 4\n")
    assert effective([], {}).placement_engine_lease == 10.0
    assert effective(["--config", str(f)], {}).placement_engine_lease == 4.0
    assert effective([], {"PELOTON_PLACEMENT_ENGINE_LEASE": "2.5"}).placement_engine_lease == 2.5
    assert effective(["--config", str(f), "--placement-engine-lease", "30"], {}).placement_engine_lease == 30.0
    for bad in (0.5, 601.0, float("nan")):
        with pytest.raises(InvalidArgument, match="--placement-engine-lease: must be between 1 and 600 seconds"):
            ServerConfig("127.0.0.1:0", None, tmp_path, placement_engine_lease_s=bad).check()


def test_the_grpc_workers_and_the_launchers_come_from_any_source_and_are_checked(tmp_path: Path) -> None:
    from peloton.settings import MAX_GRPC_WORKERS, MAX_LAUNCHERS, ServerConfig

    f = tmp_path / "peloton.toml"
    f.write_text("grpc-workers = 64\nlaunchers = 8\n")
    a = effective([], {})
    assert (a.grpc_workers, a.launchers) == (ServerConfig.workers, ServerConfig.launchers) == (32, 4)
    shown = " ".join(server_parser().format_help().split())  # the bounds the help states are the ones checked
    assert f"1 to {MAX_GRPC_WORKERS}; with" in shown and f"1 to {MAX_LAUNCHERS} (default 4)" in shown
    a = effective(["--config", str(f)], {})
    assert (a.grpc_workers, a.launchers) == (64, 8)
    a = effective(["--config", str(f), "--launchers", "2"], {"PELOTON_GRPC_WORKERS": "128"})
    assert (a.grpc_workers, a.launchers) == (128, 2)
    for workers, launchers, field in ((0, 4, "--grpc-workers"), (MAX_GRPC_WORKERS + 1, 4, "--grpc-workers"),
                                      (32, 0, "--launchers"), (32, MAX_LAUNCHERS + 1, "--launchers")):
        with pytest.raises(InvalidArgument, match=f"{field}: must be between 1 and "):
            ServerConfig("127.0.0.1:0", None, tmp_path, workers=workers, launchers=launchers).check()


def test_the_warm_wrappers_come_from_any_source_and_are_checked(tmp_path: Path) -> None:
    from peloton.hostmgr.local.backend import DEFAULT_WARM_WRAPPERS
    from peloton.settings import MAX_WARM_WRAPPERS, ServerConfig

    f = tmp_path / "peloton.toml"
    f.write_text("warm-wrappers = 0\n")
    assert effective([], {}).warm_wrappers == ServerConfig.warm_wrappers == DEFAULT_WARM_WRAPPERS == 8
    shown = " ".join(server_parser().format_help().split())
    assert f"up to N (0 to {MAX_WARM_WRAPPERS}; 0: none)" in shown
    assert effective(["--config", str(f)], {}).warm_wrappers == 0
    assert effective(["--config", str(f)], {"PELOTON_WARM_WRAPPERS": "16"}).warm_wrappers == 16
    assert effective(["--config", str(f), "--warm-wrappers", "2"], {"PELOTON_WARM_WRAPPERS": "16"}).warm_wrappers == 2
    for bad in (-1, MAX_WARM_WRAPPERS + 1):
        with pytest.raises(InvalidArgument, match=f"--warm-wrappers: must be between 0 and {MAX_WARM_WRAPPERS}"):
            ServerConfig("127.0.0.1:0", None, tmp_path, warm_wrappers=bad).check()


def test_the_placement_order_comes_from_any_source_and_is_checked(tmp_path: Path) -> None:
    from peloton.settings import ServerConfig

    f = tmp_path / "peloton.toml"
    f.write_text('placement-order = "fifo"\n')
    assert effective([], {}).placement_order == "backfill"
    assert effective(["--config", str(f)], {}).placement_order == "fifo"
    assert effective([], {"PELOTON_PLACEMENT_ORDER": "fifo"}).placement_order == "fifo"
    assert effective(["--config", str(f), "--placement-order", "backfill"], {}).placement_order == "backfill"
    with pytest.raises(InvalidArgument, match="--placement-order: must be one of backfill, fifo, got 'lifo'"):
        ServerConfig("127.0.0.1:0", None, tmp_path, placement_order="lifo").check()


def test_the_queue_order_comes_from_any_source_and_is_checked(tmp_path: Path) -> None:
    from peloton.cli.groups.server import _promote_after
    from peloton.resmgr.ordering import QueueOrder
    from peloton.settings import ServerConfig

    f = tmp_path / "peloton.toml"
    f.write_text('queue-order = "gpu-time"\nqueue-promote-after = "90m"\n')
    default = effective([], {})
    assert (default.queue_order, _promote_after(default.queue_promote_after)) == ("arrival", 4 * 3600.0)
    a = effective(["--config", str(f)], {})
    assert (a.queue_order, _promote_after(a.queue_promote_after)) == ("gpu-time", 5400.0)
    assert effective([], {"PELOTON_QUEUE_ORDER": "gpu-time"}).queue_order == "gpu-time"
    a = effective(["--config", str(f), "--queue-order", "arrival", "--queue-promote-after", "2h"], {})
    assert (a.queue_order, _promote_after(a.queue_promote_after)) == ("arrival", 7200.0)
    cfg = ServerConfig("127.0.0.1:0", None, tmp_path, queue_order="gpu-time", queue_promote_after_s=5400.0)
    cfg.check()
    assert cfg.queue_order_value() == QueueOrder("gpu-time", 5400.0)
    with pytest.raises(InvalidArgument, match="--queue-order: must be one of arrival, gpu-time, got 'sjf'") as e:
        ServerConfig("127.0.0.1:0", None, tmp_path, queue_order="sjf").check()
    assert e.value.field == "--queue-order"
    with pytest.raises(InvalidArgument, match="--queue-promote-after: must be a positive number of seconds") as e:
        ServerConfig("127.0.0.1:0", None, tmp_path, queue_order="gpu-time", queue_promote_after_s=0.0).check()
    assert e.value.field == "--queue-promote-after"
    with pytest.raises(InvalidArgument, match="--queue-promote-after"):
        _promote_after("soon")


@pytest.mark.parametrize("text,message", [
    ('listn = "x"', "unknown key 'listn' (did you mean 'listen'?)"),
    ('rate-limit = "fast"', "rate-limit: must be a number, got 'fast'"),
    ('backend = "k8s"', "backend: must be one of local, mesos, sim, got 'k8s'"),
    ("insecure = 1", "insecure: must be true or false, got 1"),
    ("listen = true", "listen: must be a string, got True"),
    ("preemption-settle = -1", "preemption-settle: -1 is not between 0 and 86400 seconds"),
    ("listen = ", "not valid TOML"),
    ('task-cgroups = "on"', "task-cgroups: must be one of auto, off, got 'on'"),
    ('placement-order = "lifo"', "placement-order: must be one of backfill, fifo, got 'lifo'"),
    ('queue-order = "sjf"', "queue-order: must be one of arrival, gpu-time, got 'sjf'"),
])
def test_a_bad_file_is_one_line_naming_the_key(tmp_path: Path, text: str, message: str) -> None:
    f = tmp_path / "peloton.toml"
    f.write_text(text + "\n")
    with pytest.raises(InvalidArgument) as e:
        effective(["--config", str(f)], {})
    assert e.value.message.startswith(f"{f}: ") and message in e.value.message, e.value.message
    with pytest.raises(InvalidArgument, match="PELOTON_INSECURE: must be true or false"):
        effective([], {"PELOTON_INSECURE": "maybe"})
    with pytest.raises(InvalidArgument, match="PELOTON_LOCAL_HOSTS: must be an integer, got 'two'"):
        effective([], {"PELOTON_LOCAL_HOSTS": "two"})
    with pytest.raises(InvalidArgument, match="--config: cannot read"):
        effective(["--config", str(tmp_path / "missing.toml")], {})


def test_print_config_shows_the_effective_settings(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    f = tmp_path / "peloton.toml"
    f.write_text('listen = "127.0.0.1:6000"\ninsecure = true\n')
    monkeypatch.setenv("PELOTON_LOG_FORMAT", "json")
    assert main(["server", "--config", str(f), "--print-config", "--rate-limit", "7"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert {'listen = "127.0.0.1:6000"', "insecure = true", 'log-format = "json"', "rate-limit = 7.0",
            "# db = (not set)"} <= set(out)
    # and it reads back as the same settings
    import tomllib
    back = tomllib.loads("\n".join(out))
    assert back["listen"] == "127.0.0.1:6000" and back["rate-limit"] == 7.0


def test_a_bad_setting_stops_the_server_before_it_starts(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "peloton.toml"
    f.write_text('listn = "x"\n')
    with pytest.raises(SystemExit) as e:
        main(["server", "--config", str(f)])
    assert e.value.code == 2
    assert capsys.readouterr().err == f"peloton: error: {f}: unknown key 'listn' (did you mean 'listen'?)\n"


def test_a_repeatable_flag_takes_a_list_and_the_place_that_wins_gives_all_of_its_values(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "peloton.toml"
    f.write_text('backend = "sim"\nsim-host-group = ["8:cpu=48,mem=192Gi,gpu=4:gpu_model=t4,nic_gbps=50", '
                 '"4:cpu=96,mem=1Ti,gpu=8:gpu_model=a100,gpu_link=nvlink"]\n')
    assert effective(["--config", str(f)], {}).sim_host_group == [
        "8:cpu=48,mem=192Gi,gpu=4:gpu_model=t4,nic_gbps=50", "4:cpu=96,mem=1Ti,gpu=8:gpu_model=a100,gpu_link=nvlink"]
    # the variable's values (separated by `;`) replace the file's, the flags' replace both: they do not add up
    env = {"PELOTON_SIM_HOST_GROUP": "2:cpu=4;3:cpu=8,gpu=1:gpu_model=v100"}
    assert effective(["--config", str(f)], env).sim_host_group == ["2:cpu=4", "3:cpu=8,gpu=1:gpu_model=v100"]
    assert effective(["--config", str(f), "--sim-host-group", "1:cpu=1"], env).sim_host_group == ["1:cpu=1"]
    f.write_text('sim-host-group = "1:cpu=2"\n')
    assert effective(["--config", str(f)], {}).sim_host_group == ["1:cpu=2"]
    f.write_text("sim-host-group = [1, 2]\n")
    with pytest.raises(InvalidArgument, match="sim-host-group: must be a list of strings"):
        effective(["--config", str(f)], {})
    # --print-config writes the list as TOML reads it back
    assert main(["server", "--backend", "sim", "--print-config", "--sim-host-group", "1:cpu=1:nic_gbps=10",
                 "--sim-host-group", "2:cpu=2"]) == 0
    import tomllib
    back = tomllib.loads(capsys.readouterr().out)
    assert back["sim-host-group"] == ["1:cpu=1:nic_gbps=10", "2:cpu=2"]


def test_a_console_beyond_loopback_needs_tls_with_client_certificates_or_tokens(tmp_path: Path) -> None:
    """As --listen: an HTTPS console (the API's certificate) whose callers prove who they are may listen where other
    machines reach it; plain HTTP, or TLS without authentication, may not (without --insecure)."""
    from peloton.security import certs
    from peloton.settings import ServerConfig

    certs.init(tmp_path / "pki", ["node-a"])
    cert, key = tmp_path / "pki" / "server.pem", tmp_path / "pki" / "server-key.pem"
    ServerConfig("127.0.0.1:0", None, tmp_path, ui_listen="0.0.0.0:5393", tls_cert=cert, tls_key=key,
                 tls_client_ca=tmp_path / "pki" / "ca.pem").check()
    for refused in (ServerConfig("127.0.0.1:0", None, tmp_path, ui_listen="0.0.0.0:5393"),
                    ServerConfig("127.0.0.1:0", None, tmp_path, ui_listen="0.0.0.0:5393", tls_cert=cert, tls_key=key)):
        with pytest.raises(InvalidArgument, match="--ui-listen: 0.0.0.0:5393 can be reached from other machines"):
            refused.check()
    ServerConfig("127.0.0.1:0", None, tmp_path, ui_listen="0.0.0.0:5393", insecure=True).check()
    with pytest.raises(InvalidArgument, match="--ui-login-ttl: must be between 1 and 3600 seconds, got 0"):
        ServerConfig("127.0.0.1:0", None, tmp_path, ui_login_ttl_s=0).check()
    assert effective(["--ui-login-ttl", "30"], {}).ui_login_ttl == 30


def test_the_refusal_of_a_listen_others_reach_suggests_only_what_listen_takes(tmp_path: Path) -> None:
    """--listen is HOST:PORT; a unix: socket is --unix-socket's (the daemon's own user's), so the refusal must not
    send a user to `--listen unix:...`, which is refused in turn as not HOST:PORT."""
    from peloton.settings import ServerConfig

    with pytest.raises(InvalidArgument) as refused:
        ServerConfig("0.0.0.0:5391", None, tmp_path).check()
    assert "--listen: 0.0.0.0:5391 can be reached from other machines" in str(refused.value)
    assert "unix:" not in str(refused.value), str(refused.value)
    with pytest.raises(InvalidArgument, match="--listen: expected HOST:PORT"):
        ServerConfig("unix:/tmp/peloton.sock", None, tmp_path).check()
