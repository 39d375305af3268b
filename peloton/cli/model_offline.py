"""`peloton model fit|predict|plan`: the cost model of model-aware plans, offline (no daemon, no gRPC).

Scripts and notebooks use them: fit a profile into a model document, predict placements' step times, rank plans on
a cluster described by its free GPUs (docs/model-aware.md, docs/cli.md). Errors name the flag, or the file's row
and column; bad input exits 2, a request no plan fits exits 1.

Start-up: `register` runs on every `peloton` call (it builds the parser), so this module imports nothing at its
top; each command imports what it uses when it runs.
"""

from __future__ import annotations

import argparse
import sys

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (see main.py)
if TYPE_CHECKING:
    from typing import Any

    from peloton.modelaware.cost import CostParams, HostUse, Prediction, Reference
    from peloton.modelaware.document import ModelDocument
    from peloton.modelaware.gpus import GpuTable
    from peloton.modelaware.plan import FreeHost, Plan

MAX_INPUT_BYTES = 64 * 1024 * 1024
MAX_HOSTS = 100_000
MAX_INPUT_ROWS = 100_000
MAX_TOP = 100
DEFAULT_PLACEMENTS_HELP = "e.g. 1,4,11,1111,44,4444"


def register(sub: Any) -> None:
    """Add `fit`, `predict` and `plan` to the subparsers of the `model` command."""

    def out(sp: argparse.ArgumentParser) -> None:
        from peloton.cli.parser import output_flag

        output_flag(sp, "table (default; wide: the same), json or yaml: a list of objects (docs/cli.md, "
                        "Model-aware plans)")
        sp.set_defaults(prints_records=True)

    def hardware(sp: argparse.ArgumentParser, what: str) -> None:
        sp.add_argument("--gpu-model", default=None, metavar="NAME",
                        help=f"{what}: GPU model (t4, v100, a100, ...: docs/model-aware.md; --gpu-table adds more)")
        sp.add_argument("--nic-gbps", type=float, default=None, metavar="GBPS", help=f"{what}: NIC bandwidth, Gb/s")
        sp.add_argument("--gpu-link", choices=["pcie", "nvlink"], default=None,
                        help=f"{what}: link between a host's GPUs")
        sp.add_argument("--gpu-table", default=None, metavar="FILE",
                        help="JSON of GPU models replacing or adding rows of the built-in table "
                             "({\"name\": {\"relative\": 2.1}}; docs/model-aware.md)")

    x = sub.add_parser("fit", help="fit the cost model to a profile (CSV placement,local_bsz,step_time[,sync_time]) "
                                   "and write the model document; prints the fit's error")
    x.add_argument("profile", metavar="PROFILE", help="measured step times (docs/model-aware.md, Profiles)")
    x.add_argument("--out", required=True, metavar="MODEL.json", help="where to write the model document (- for "
                                                                       "stdout; the summary then goes to stderr)")
    x.add_argument("--name", default=None, help="the model's name (default: the profile's file name, without .csv)")
    x.add_argument("--placements", default=None, metavar="P,P,...",
                   help="fit on the rows of these placements only (digits, " + DEFAULT_PLACEMENTS_HELP +
                        "; as multisets: 14 and 41 are the same) and print the error on the others too")
    x.add_argument("--sync", choices=["allreduce-ring", "allreduce-hierarchical"], default="allreduce-ring",
                   help="how the profiled job synchronised its gradients (default %(default)s)")
    hardware(x, "the hardware the profile was measured on (default t4, 25 Gb/s, pcie)")
    x.set_defaults(server_fn=cmd_model_fit)

    x = sub.add_parser("predict", help="the step time and samples/s the model predicts for placements")
    x.add_argument("model", metavar="MODEL", help="a model document (`peloton model fit` writes one)")
    g = x.add_mutually_exclusive_group(required=True)
    g.add_argument("--placement", default=None, metavar="P",
                   help="GPUs used on each host: 1134 or 1,1,3,4 (four hosts)")
    g.add_argument("--input", default=None, metavar="ROWS.csv",
                   help="CSV with the columns placement,local_bsz (a profile's step_time column, if any, is shown "
                        "as measured beside the prediction)")
    x.add_argument("--local-bsz", type=float, default=None, metavar="B",
                   help="batch per GPU, with --placement (default: the model description's)")
    x.add_argument("--servers", type=int, default=None, metavar="N",
                   help="parameter servers (ps models; default: the description's ps_count, else 1), spread over "
                        "the placement's hosts")
    hardware(x, "every host's hardware (default: the model's reference)")
    out(x)
    x.set_defaults(server_fn=cmd_model_predict)

    x = sub.add_parser("plan", help="the best plans (GPUs on which hosts) for a model on a cluster's free GPUs, "
                                    "best first")
    x.add_argument("model", metavar="MODEL", help="a model document (`peloton model fit` writes one)")
    g = x.add_mutually_exclusive_group(required=True)
    g.add_argument("--free", default=None, metavar="N,N,...",
                   help="free GPUs of each host (hosts h0, h1, ... with the model's reference hardware, or "
                        "--gpu-model/--nic-gbps/--gpu-link)")
    g.add_argument("--hosts", default=None, metavar="FILE",
                   help="CSV name,free_gpus[,gpu_model,nic_gbps,gpu_link] (an empty or absent column: the "
                        "reference's, or the flag's)")
    g = x.add_mutually_exclusive_group()
    g.add_argument("--gpus", type=int, default=None, metavar="K", help="exactly K GPUs (workers)")
    g.add_argument("--max-gpus", type=int, default=None, metavar="K",
                   help="at most K GPUs, the size chosen by the objective (default: as many as are free)")
    x.add_argument("--min-gpus", type=int, default=None, metavar="K", help="at least K GPUs (default 1)")
    g = x.add_mutually_exclusive_group()
    g.add_argument("--local-bsz", type=float, default=None, metavar="B",
                   help="batch per GPU (default: the model description's)")
    g.add_argument("--global-bsz", type=float, default=None, metavar="B",
                   help="batch over the gang: each GPU's is B / K")
    x.add_argument("--objective", choices=["throughput", "efficiency"], default="throughput",
                   help="rank by samples/s, or by samples/s per GPU (default %(default)s)")
    x.add_argument("--servers", type=int, default=None, metavar="N",
                   help="parameter servers (ps models; default: the description's ps_count, else chosen)")
    x.add_argument("--top", type=int, default=5, metavar="N",
                   help="plans shown, one per shape (GPUs per host) (default %(default)s)")
    hardware(x, "--free hosts' hardware, and the default of --hosts' empty columns (default: the model's "
                "reference)")
    out(x)
    x.set_defaults(server_fn=cmd_model_plan)


# --- shared -------------------------------------------------------------------------------------------------------


def _bad(message: str, field: str) -> Exception:
    from peloton.errors import InvalidArgument

    return InvalidArgument(message, field=field)


def _read(path: str, flag: str) -> str:
    """The text of an input file, read up to MAX_INPUT_BYTES and no further (files.read_bounded): a larger one, or
    /dev/zero, is refused naming the flag, the file and the limit."""
    import io

    from peloton.files import read_bounded

    try:
        raw = read_bounded(path, MAX_INPUT_BYTES, f"{flag}: {path}", "an input file", field=flag)
    except OSError as e:
        raise _bad(f"{flag}: cannot read {path}: {e.strerror}", flag) from None
    try:
        return io.TextIOWrapper(io.BytesIO(raw), encoding="utf-8").read()  # newlines read as a text file's
    except UnicodeDecodeError:
        raise _bad(f"{flag}: {path} is not UTF-8 text", flag) from None


def _table(a: argparse.Namespace) -> GpuTable:
    from peloton.modelaware.gpus import DEFAULT_TABLE, load_table

    if a.gpu_table is None:
        return DEFAULT_TABLE
    return load_table(_read(a.gpu_table, "--gpu-table"), source=a.gpu_table)


def _gpu_model(name: str, table: GpuTable, where: str) -> str:
    n = name.strip().lower()
    if n not in table.models:
        known = ", ".join(sorted(m for m in table.models if m not in ("unknown", "sim-gpu")))
        raise _bad(f"{where}: unknown GPU model {name!r} (known: {known}; --gpu-table adds one)", where)
    return n


def _nic(v: float, where: str) -> float:
    import math

    if not math.isfinite(v) or v <= 0:
        raise _bad(f"{where}: expected a positive number of Gb/s, got {v:g}", where)
    return v


def _hardware(a: argparse.Namespace, base: Reference, table: GpuTable) -> Reference:
    """`base` with the flags --gpu-model, --nic-gbps, --gpu-link that were given."""
    from peloton.modelaware.cost import Reference

    return Reference(
        gpu_model=_gpu_model(a.gpu_model, table, "--gpu-model") if a.gpu_model is not None else base.gpu_model,
        nic_gbps=_nic(a.nic_gbps, "--nic-gbps") if a.nic_gbps is not None else base.nic_gbps,
        gpu_link=a.gpu_link or base.gpu_link)


def _load_model(path: str, table: GpuTable) -> tuple[ModelDocument, CostParams]:
    import json

    from peloton.errors import InvalidArgument
    from peloton.modelaware.document import parse_document

    text = _read(path, "MODEL")
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as e:
        raise _bad(f"{path}: not JSON: {e}", "model") from None
    try:
        doc = parse_document(raw)
        return doc, doc.cost_params(table)
    except InvalidArgument as e:
        raise _bad(f"{path}: {e.message}", e.field or "model") from None


def _number(v: float) -> float | int:
    """128.0 -> 128 in the JSON: a batch size as the user wrote it."""
    return int(v) if float(v).is_integer() else v


def _positive(v: float | None, flag: str) -> float | None:
    import math

    if v is not None and (not math.isfinite(v) or v <= 0):
        raise _bad(f"{flag}: must be greater than 0, got {v:g}", flag)
    return v


def _dumps(obj: object) -> str:
    import json

    return json.dumps(obj, indent=2)


def _bsz(v: float) -> str:
    return f"{_number(v):.4g}" if not float(v).is_integer() else str(int(v))


def _write_whole(path: str, text: str) -> None:
    """Write `text` to `path` whole or not at all: a temporary file beside it, renamed over it (an existing model
    document is never left half written). Raises the usage error of --out."""
    import contextlib
    import os
    import tempfile

    where = os.path.dirname(path) or "."
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(prefix=".peloton-model-", suffix=".json", dir=where)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
        tmp = None
    except OSError as e:
        raise _bad(f"--out: cannot write {path}: {e.strerror}", "--out") from None
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)


def _umask() -> int:
    import os

    mask = os.umask(0o022)  # (a one-shot command: no other thread creates files meanwhile)
    os.umask(mask)
    return mask


def _pct(v: float) -> str:
    return f"{100 * v:.1f}%"


def _seconds(v: float) -> str:
    return f"{v:.4g}"


# --- fit ----------------------------------------------------------------------------------------------------------


def _placements_flag(text: str) -> set[tuple[int, ...]]:
    from peloton.errors import InvalidArgument
    from peloton.modelaware.profile import parse_placement

    out: set[tuple[int, ...]] = set()
    for item in text.split(","):
        try:
            out.add(tuple(sorted(parse_placement(item, "--placements"))))
        except InvalidArgument:
            raise _bad(f"--placements: {item.strip()!r} is not a placement (comma-separated placements in "
                       f"digits, {DEFAULT_PLACEMENTS_HELP})", "--placements") from None
    return out


def cmd_model_fit(a: argparse.Namespace) -> int:
    import os

    from peloton.modelaware import fit as fitting
    from peloton.modelaware.cost import PARAM_NAMES, Reference
    from peloton.modelaware.document import (
        MAX_NAME_CHARS,
        MAX_PROFILE_ROWS,
        Description,
        FitInfo,
        ModelDocument,
        document_to_dict,
    )
    from peloton.modelaware.profile import format_placement, read_profile, select

    table = _table(a)
    reference = _hardware(a, Reference(), table)
    rows = read_profile(_read(a.profile, "PROFILE"), source=a.profile)
    subset = _placements_flag(a.placements) if a.placements is not None else None
    train = rows
    others = []
    if subset is not None:
        train = select(rows, subset)
        have = {tuple(sorted(r.placement)) for r in train}
        missing = sorted(subset - have)
        if missing:
            raise _bad(f"--placements: {format_placement(missing[0])} has no row in {a.profile}", "--placements")
        others = [r for r in rows if tuple(sorted(r.placement)) not in subset]
    name = a.name if a.name is not None else os.path.splitext(os.path.basename(a.profile))[0]
    if len(name) > MAX_NAME_CHARS or "\x00" in name:
        raise _bad(f"--name: at most {MAX_NAME_CHARS} characters, no NUL", "--name")
    if a.out != "-":  # before the fit (seconds on a big profile): where it goes must be writable
        where = os.path.dirname(a.out) or "."
        if os.path.isdir(a.out):
            raise _bad(f"--out: cannot write {a.out}: Is a directory", "--out")
        if not os.path.isdir(where):
            raise _bad(f"--out: cannot write {a.out}: No such directory {where}", "--out")
        if not os.access(where, os.W_OK | os.X_OK):
            raise _bad(f"--out: cannot write {a.out}: Permission denied", "--out")
    result = fitting.fit(train, reference, pattern=a.sync)
    doc = ModelDocument(name=name, description=Description(sync=a.sync), params=result.params,
                        fit=FitInfo(rows=result.rows, median_error=result.median_error, p90_error=result.p90_error,
                                    source=a.profile[-1024:]),  # a document's limit
                        profile=tuple(train[:MAX_PROFILE_ROWS]))  # what `model refit` fits again with measurements
    text = _dumps(document_to_dict(doc)) + "\n"
    if a.out == "-":
        sys.stdout.write(text)
    else:
        _write_whole(a.out, text)
    say = sys.stderr if a.out == "-" else sys.stdout
    used = f" (placements {a.placements})" if subset is not None else ""
    print(f"fitted {a.profile}: {result.rows} of {len(rows)} rows{used}, sync {a.sync}, reference "
          f"{reference.gpu_model}, {reference.nic_gbps:g} Gb/s, {reference.gpu_link}", file=say)
    print(f"  error on the fitted rows: median {_pct(result.median_error)}, p90 {_pct(result.p90_error)}, "
          f"max {_pct(result.max_error)}", file=say)
    if others:
        errs = fitting.relative_errors(result.params, others, a.sync)
        print(f"  error on the other {len(others)} rows: median {_pct(fitting.quantile(errs, 0.5))}, "
              f"p90 {_pct(fitting.quantile(errs, 0.9))}, max {_pct(max(errs))}", file=say)
    p = result.params
    fitted = set(result.fitted)
    print("  parameters: " + " ".join(f"{n}={getattr(p, n):.4g}{'' if n in fitted else ' (not fitted)'}"
                                      for n in PARAM_NAMES), file=say)
    if a.out != "-":
        print(f"wrote {a.out}", file=say)
    return 0


# --- predict ------------------------------------------------------------------------------------------------------


def _input_rows(path: str) -> list[tuple[str, tuple[int, ...], float, float | None]]:
    """(placement as written, GPUs per host, local batch, measured step time or None) of each row."""
    import math

    from peloton.errors import InvalidArgument
    from peloton.modelaware.profile import csv_rows, parse_placement

    known = ("placement", "local_bsz", "step_time", "sync_time")
    out: list[tuple[str, tuple[int, ...], float, float | None]] = []
    for where, cell in csv_rows(_read(path, "--input"), f"--input: {path}", known, 2, MAX_INPUT_ROWS, "--input"):
        text = cell["placement"]
        try:
            placement = parse_placement(text, "placement")
        except InvalidArgument as e:
            raise _bad(f"{where}, column {e.message}", "placement") from None
        values: dict[str, float] = {}
        for col in ("local_bsz", "step_time"):
            if not cell.get(col):
                if col == "local_bsz":
                    raise _bad(f"{where}, column local_bsz: expected a positive number, got ''", col)
                continue
            try:
                v = float(cell[col])
            except ValueError:
                v = math.nan
            if not math.isfinite(v) or v <= 0:
                raise _bad(f"{where}, column {col}: expected a positive number, got {cell[col]!r}", col)
            values[col] = v
        out.append((text, placement, values["local_bsz"], values.get("step_time")))
    return out


def _with_servers(placement: tuple[int, ...], hw: Reference, servers: int) -> list[HostUse]:
    """The placement's hosts, each with `hw`, and `servers` parameter servers spread over them in turn."""
    from peloton.modelaware.cost import HostUse

    per = [servers // len(placement) + (1 if i < servers % len(placement) else 0) for i in range(len(placement))]
    return [HostUse(g, hw.gpu_model, hw.nic_gbps, hw.gpu_link, s) for g, s in zip(placement, per, strict=True)]


def _prediction_json(written: str, p: Prediction, measured: float | None) -> dict[str, object]:
    d: dict[str, object] = {"placement": written, "gpus_per_host": list(p.gpus_per_host),
                            "local_bsz": _number(p.local_bsz), "step_time": p.step_time, "sync_time": p.sync_time,
                            "compute_time": p.compute_time, "samples_per_s": p.samples_per_s}
    if measured is not None:
        d["measured_step_time"] = measured
    return d


def cmd_model_predict(a: argparse.Namespace) -> int:
    from peloton.modelaware.cost import PS, predict
    from peloton.modelaware.profile import parse_placement

    table = _table(a)
    doc, params = _load_model(a.model, table)
    hw = _hardware(a, params.reference, table)
    pattern = doc.description.sync
    if a.servers is not None and pattern != PS:
        raise _bad(f"--servers: only for a {PS} model (this one's sync is {pattern})", "--servers")
    if a.servers is not None and not 1 <= a.servers <= 4096:
        raise _bad(f"--servers: must be 1..4096, got {a.servers}", "--servers")
    servers = a.servers or doc.description.ps_count or 1
    _positive(a.local_bsz, "--local-bsz")
    if a.input is not None:
        if a.local_bsz is not None:
            raise _bad("--local-bsz: not with --input (its local_bsz column gives each row's)", "--local-bsz")
        rows = _input_rows(a.input)
    else:
        placement = parse_placement(a.placement, "--placement")
        bsz = a.local_bsz or doc.description.local_bsz or (
            doc.description.global_bsz / sum(placement) if doc.description.global_bsz else 0.0)
        if not bsz:
            raise _bad("--local-bsz: required (the model's description gives no local_bsz or global_bsz)",
                       "--local-bsz")
        rows = [(a.placement.strip(), placement, bsz, None)]
    results = []
    for written, placement, bsz, measured in rows:
        hosts = _with_servers(placement, hw, servers if pattern == PS else 0)
        results.append((written, predict(params, hosts, bsz, pattern, table), measured))
    from peloton.cli import render

    if a.output in render.DOCUMENTS:
        print((render.dumps if render.FORMAT == "yaml" else _dumps)([_prediction_json(w, p, m) for w, p, m in results]))
        return 0
    from peloton.cli.render import table as render_table

    measured_any = any(m is not None for _, _, m in results)
    lines = []
    for w, p, m in results:
        line: list[object] = [w, _bsz(p.local_bsz), _seconds(p.step_time), _seconds(p.sync_time),
                              f"{p.samples_per_s:.4g}"]
        if measured_any:
            line += ["-", "-"] if m is None else [_seconds(m), f"{100 * (p.step_time - m) / m:+.1f}%"]
        lines.append(line)
    headers = ["PLACEMENT", "LOCAL_BSZ", "STEP_TIME(S)", "SYNC_TIME(S)", "SAMPLES/S"]
    print(render_table(lines, headers + (["MEASURED(S)", "ERROR"] if measured_any else [])))
    return 0


# --- plan ---------------------------------------------------------------------------------------------------------


def _free_flag(text: str, hw: Reference) -> list[FreeHost]:
    from peloton.modelaware.plan import FreeHost
    from peloton.modelaware.profile import MAX_GPUS_PER_HOST

    parts = [p.strip() for p in text.split(",")]
    if len(parts) > MAX_HOSTS:
        raise _bad(f"--free: more than {MAX_HOSTS} hosts", "--free")
    out = []
    for i, p in enumerate(parts):
        if not p.isascii() or not p.isdigit() or int(p) > MAX_GPUS_PER_HOST:
            raise _bad(f"--free: host {i + 1}: {p!r} is not a number of free GPUs (0..{MAX_GPUS_PER_HOST}; "
                       "comma-separated, one per host)", "--free")
        out.append(FreeHost(f"h{i}", int(p), hw.gpu_model, hw.nic_gbps, hw.gpu_link))
    return out


def _hosts_file(path: str, hw: Reference, table: GpuTable) -> list[FreeHost]:
    import math

    from peloton.modelaware.gpus import LINK_GBYTES_S
    from peloton.modelaware.plan import FreeHost
    from peloton.modelaware.profile import MAX_GPUS_PER_HOST, csv_rows

    known = ("name", "free_gpus", "gpu_model", "nic_gbps", "gpu_link")
    out: list[FreeHost] = []
    seen: dict[str, str] = {}
    for where, cells in csv_rows(_read(path, "--hosts"), f"--hosts: {path}", known, 2, MAX_HOSTS, "--hosts"):
        cell = cells.get
        name = cell("name", "")
        if not name or len(name) > 253:
            raise _bad(f"{where}, column name: expected a host name of 1..253 characters, got {name!r}", "name")
        if name in seen:
            raise _bad(f"{where}, column name: {name!r} is also in {seen[name]}", "name")
        seen[name] = where.rpartition(": ")[2]
        free = cell("free_gpus", "")
        if not free.isascii() or not free.isdigit() or int(free) > MAX_GPUS_PER_HOST:
            raise _bad(f"{where}, column free_gpus: expected 0..{MAX_GPUS_PER_HOST}, got {free!r}", "free_gpus")
        model = _gpu_model(cell("gpu_model", ""), table, f"{where}, column gpu_model") if cell("gpu_model", "") \
            else hw.gpu_model
        nic = hw.nic_gbps
        if cell("nic_gbps", ""):
            try:
                nic = float(cell("nic_gbps", ""))
            except ValueError:
                nic = math.nan
            if not math.isfinite(nic) or nic <= 0:
                raise _bad(f"{where}, column nic_gbps: expected a positive number, got {cell('nic_gbps', '')!r}",
                           "nic_gbps")
        link = cell("gpu_link", "") or hw.gpu_link
        if link not in LINK_GBYTES_S:
            raise _bad(f"{where}, column gpu_link: expected one of {', '.join(LINK_GBYTES_S)}, got {link!r}",
                       "gpu_link")
        out.append(FreeHost(name, int(free), model, nic, link))
    return out


def _plan_json(rank: int, p: Plan) -> dict[str, object]:
    pred = p.prediction
    return {"rank": rank, "gpus": p.gpus, "gpus_per_host": list(p.gpus_per_host),
            "hosts": [{"name": name, "gpus": g} for name, g in p.hosts], "local_bsz": _number(pred.local_bsz),
            "step_time": pred.step_time, "sync_time": pred.sync_time, "compute_time": pred.compute_time,
            "samples_per_s": p.samples_per_s, "servers": list(p.servers)}


def _hosts_cell(p: Plan, most: int = 6) -> str:
    shown = " ".join(f"{name}:{g}" for name, g in p.hosts[:most])
    return shown + (f" (+{len(p.hosts) - most} more)" if len(p.hosts) > most else "")


def cmd_model_plan(a: argparse.Namespace) -> int:
    from peloton.errors import FailedPrecondition, InvalidArgument
    from peloton.modelaware.cost import PS
    from peloton.modelaware.plan import MAX_PLAN_GPUS, MAX_SERVERS, PlanRequest, search

    table = _table(a)
    doc, params = _load_model(a.model, table)
    hw = _hardware(a, params.reference, table)
    hosts = _free_flag(a.free, hw) if a.free is not None else _hosts_file(a.hosts, hw, table)
    for flag, v in (("--gpus", a.gpus), ("--max-gpus", a.max_gpus), ("--min-gpus", a.min_gpus)):
        if v is not None and not 1 <= v <= MAX_PLAN_GPUS:
            raise _bad(f"{flag}: must be 1..{MAX_PLAN_GPUS}, got {v}", flag)
    if a.min_gpus is not None and a.gpus is not None:
        raise _bad("--min-gpus: not with --gpus (which asks for exactly K)", "--min-gpus")
    if not 1 <= a.top <= MAX_TOP:
        raise _bad(f"--top: must be 1..{MAX_TOP}, got {a.top}", "--top")
    pattern = doc.description.sync
    if a.servers is not None and pattern != PS:
        raise _bad(f"--servers: only for a {PS} model (this one's sync is {pattern})", "--servers")
    if a.servers is not None and not 1 <= a.servers <= MAX_SERVERS:
        raise _bad(f"--servers: must be 1..{MAX_SERVERS}, got {a.servers}", "--servers")
    local = _positive(a.local_bsz, "--local-bsz")
    glob = _positive(a.global_bsz, "--global-bsz")
    if local is None and glob is None:
        local = doc.description.local_bsz or None
        glob = doc.description.global_bsz or None
        if local is None and glob is None:
            raise _bad("--local-bsz: required, or --global-bsz (the model's description gives neither)",
                       "--local-bsz")
    req = PlanRequest(gpus=a.gpus or 0, max_gpus=a.max_gpus or 0, min_gpus=a.min_gpus or 1, local_bsz=local or 0.0,
                      global_bsz=glob or 0.0, objective=a.objective, pattern=pattern,
                      servers=(a.servers or doc.description.ps_count or 0) if pattern == PS else 0, top=a.top)
    try:
        plans = search(params, hosts, req, table)
    except InvalidArgument as e:  # the request's fields, as flags
        f = e.field or ""
        raise _bad(f"--{f.replace('_', '-')}{e.message.removeprefix(f)}" if f else e.message, f) from None
    if not plans:
        free = sum(h.free_gpus for h in hosts)
        want = a.gpus or a.min_gpus or 1
        raise FailedPrecondition(f"no plan fits: the hosts have {free} free GPU(s), the request needs {want}")
    from peloton.cli import render

    if a.output in render.DOCUMENTS:
        print((render.dumps if render.FORMAT == "yaml" else _dumps)([_plan_json(i, p) for i, p in enumerate(plans, start=1)]))
        return 0
    from peloton.cli.render import table as render_table

    rows: list[list[object]] = []
    for i, p in enumerate(plans, start=1):
        row: list[object] = [i, p.gpus, ",".join(map(str, p.gpus_per_host)), _bsz(p.prediction.local_bsz),
                             _seconds(p.prediction.step_time), f"{p.samples_per_s:.4g}",
                             f"{p.samples_per_s / p.gpus:.4g}"]
        if pattern == PS:
            row.append(",".join(p.servers))
        row.append(_hosts_cell(p))
        rows.append(row)
    headers = ["#", "GPUS", "PER HOST", "LOCAL_BSZ", "STEP_TIME(S)", "SAMPLES/S", "PER GPU"]
    print(render_table(rows, headers + (["SERVERS"] if pattern == PS else []) + ["HOSTS"]))
    return 0
