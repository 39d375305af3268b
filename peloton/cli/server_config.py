"""`peloton server`'s settings from three places, one order: a TOML file (`--config FILE`, or PELOTON_SERVER_CONFIG),
then environment variables (PELOTON_<FLAG>, e.g. PELOTON_METRICS_LISTEN for --metrics-listen), then the command
line; the later wins. The file's keys are the flags' names without the dashes in front (`metrics-listen =
"127.0.0.1:5392"`; `insecure = true` for a switch; a list of strings for a flag that may be repeated,
`sim-host-group = ["8:cpu=48,mem=192Gi,gpu=4:gpu_model=t4", ...]`, whose variable separates them with `;`). Read with the standard library (tomllib), checked before the
daemon starts: an unknown key or a bad value is one line naming the file and the key.
"""

from __future__ import annotations

import argparse
import difflib
import os
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from peloton.domain import limits
from peloton.errors import InvalidArgument
from peloton.files import read_bounded

CONFIG_ENV = "PELOTON_SERVER_CONFIG"
_NOT_SETTINGS = {"config", "print-config", "help"}  # flags that are not settings themselves


def _settings(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    """Key (the long flag without its dashes) -> its action."""
    out = {}
    for action in parser._actions:  # argparse has no public list of a parser's actions
        longs = [o for o in action.option_strings if o.startswith("--")]
        if longs and longs[0][2:] not in _NOT_SETTINGS:
            out[longs[0][2:]] = action
    return out


def env_name(key: str) -> str:
    return "PELOTON_" + key.upper().replace("-", "_")


def _is_switch(action: argparse.Action) -> bool:
    return isinstance(action, argparse._StoreTrueAction)


def _is_repeatable(action: argparse.Action) -> bool:
    return isinstance(action, argparse._AppendAction)


def _args(key: str, action: argparse.Action, value: Any, where: str) -> list[str]:
    """The command-line form of one setting, checked with the flag's own type and choices. A repeatable flag
    (`sim-host-group`) takes a list of values, each given once (or one value)."""
    if _is_repeatable(action) and isinstance(value, list):
        if not _all_text(value):
            raise InvalidArgument(f"{where}: must be a list of strings, got {value!r}", field=key)
        return [arg for v in value for arg in _args(key, action, v, where)]
    if _is_switch(action):
        if not isinstance(value, bool):
            raise InvalidArgument(f"{where}: must be true or false, got {value!r}", field=key)
        return [f"--{key}"] if value else []
    if isinstance(value, bool) or isinstance(value, (dict, list)) and not _all_text(value):
        raise InvalidArgument(f"{where}: must be a {'number' if action.type in (int, float) else 'string'}, "
                              f"got {value!r}", field=key)
    text = ",".join(value) if isinstance(value, list) else str(value)
    try:
        converted = action.type(text) if callable(action.type) else text
    except (ValueError, argparse.ArgumentTypeError) as e:
        why = {int: "must be an integer", float: "must be a number"}.get(action.type)  # type: ignore[call-overload]
        raise InvalidArgument(f"{where}: {why}, got {value!r}" if why else f"{where}: {e}", field=key) from None
    if action.choices is not None and converted not in action.choices:
        raise InvalidArgument(f"{where}: must be one of {', '.join(map(str, action.choices))}, got {value!r}",
                              field=key)
    return [f"--{key}", text]


def _all_text(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def from_file(path: Path, settings: Mapping[str, argparse.Action]) -> list[str]:
    try:
        raw = read_bounded(path, limits.MAX_CONFIG_FILE_BYTES, f"--config: {path}", "a server config file",
                           field="config")
        doc = tomllib.loads(raw.decode("utf-8"))
    except OSError as e:
        raise InvalidArgument(f"--config: cannot read {path}: {e.strerror}", field="config") from None
    except UnicodeDecodeError as e:  # TOML is UTF-8 (this was a traceback)
        raise InvalidArgument(f"{path}: not valid TOML: not UTF-8 text (at byte {e.start + 1})",
                              field="config") from None
    except tomllib.TOMLDecodeError as e:
        raise InvalidArgument(f"{path}: not valid TOML: {e}", field="config") from None
    out: list[str] = []
    for key, value in doc.items():
        action = settings.get(key)
        if action is None:
            close = difflib.get_close_matches(key, list(settings), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise InvalidArgument(f"{path}: unknown key {key!r}{hint}", field=key)
        out += _args(key, action, value, f"{path}: {key}")
    return out


def from_env(environ: Mapping[str, str], settings: Mapping[str, argparse.Action]) -> list[str]:
    out: list[str] = []
    for key, action in settings.items():
        name = env_name(key)
        if name not in environ:
            continue
        raw = environ[name]
        if _is_switch(action):
            flag = raw.strip().lower()
            if flag not in ("1", "true", "yes", "0", "false", "no", ""):
                raise InvalidArgument(f"{name}: must be true or false (1/0, yes/no), got {raw!r}", field=key)
            out += [f"--{key}"] if flag in ("1", "true", "yes") else []
        elif _is_repeatable(action):  # several values: separated by `;` (`8:cpu=48:gpu_model=t4;4:cpu=96`)
            out += _args(key, action, [v for v in raw.split(";") if v.strip()], name)
        else:
            out += _args(key, action, raw, name)
    return out


def layered(parser: argparse.ArgumentParser, argv: Sequence[str], environ: Mapping[str, str] | None = None
            ) -> list[str]:
    """The server's argv with the file's and the environment's settings in front (the command line's win)."""
    environ = os.environ if environ is None else environ
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--config", default=None)
    known, _ = pre.parse_known_args(list(argv))
    settings = _settings(parser)
    path = known.config or environ.get(CONFIG_ENV)
    file_args = from_file(Path(path), settings) if path else []
    env_args = from_env(environ, settings)
    # a repeatable flag's values accumulate: the place that wins gives all of them (the flags' replace the
    # variable's, which replace the file's)
    repeatable = {f"--{k}" for k, a in settings.items() if _is_repeatable(a)}
    in_argv = {w.split("=", 1)[0] for w in argv} & repeatable
    env_args = _without(env_args, in_argv)
    file_args = _without(file_args, in_argv | ({w for w in env_args} & repeatable))
    return [*file_args, *env_args, *argv]


def _without(args: list[str], flags: set[str]) -> list[str]:
    """`args` (pairs `--flag value`, or a lone switch) less the pairs of `flags`."""
    out: list[str] = []
    i = 0
    while i < len(args):
        if args[i] in flags:
            i += 2
            continue
        out.append(args[i])
        i += 1
    return out


def render(parser: argparse.ArgumentParser, ns: argparse.Namespace) -> str:
    """`--print-config`: every setting's effective value, as a TOML file would say it."""
    lines = ["# peloton server: the effective settings (the file, then PELOTON_* variables, then the flags)"]
    for key, action in sorted(_settings(parser).items()):
        value = getattr(ns, action.dest, None)
        if value is None:
            lines.append(f"# {key} = (not set)")
        elif isinstance(value, bool):
            lines.append(f"{key} = {'true' if value else 'false'}")
        elif isinstance(value, (int, float)):
            lines.append(f"{key} = {value}")
        elif isinstance(value, list):  # a repeatable flag's values
            lines.append(f"{key} = [{', '.join(_toml_string(str(v)) for v in value)}]")
        else:
            lines.append(f"{key} = {_toml_string(str(value))}")
    return "\n".join(lines) + "\n"


def _toml_string(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'
