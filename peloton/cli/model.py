"""`peloton model ...`: the model documents of the model-aware cost model (docs/model-aware.md).

The commands that talk to the daemon's ModelService (create, get, list, delete) are here; `register_stored`
puts them on the `model` group's subparsers, beside which the offline commands (fit, predict, plan) go. Module
imports stay light: `build_parser` imports this module at every start of the CLI."""

from __future__ import annotations

import argparse
import sys

from peloton.cli.parser import add_command
from peloton.errors import InvalidArgument

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (start-up time: see main.py)
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from peloton.api.v1 import model_pb2
    from peloton.cli.client import Client

MAX_FILE_BYTES = 1024 * 1024  # a model document: as the daemon allows
MIN_REFIT_ROWS = 6  # profile rows and measurements together, fewer and `model refit` only records


def register_stored(models: Any, out: Callable[[argparse.ArgumentParser], None]) -> None:
    """The stored-model commands on `models`, the `model` group's subparsers; `out` adds `-o`."""
    x = models.add_parser("create", help="store a model document (JSON or YAML) under NAME, for jobs and plans to "
                                         "name; prints NAME")
    x.add_argument("name", metavar="NAME", help="1 to 128 letters, digits, '_', '.' or '-' (not first '.' or '-')")
    x.add_argument("-f", "--file", required=True, metavar="FILE",
                   help="the model document: JSON or YAML (docs/model-aware.md), or - for stdin")
    x.add_argument("--replace", action="store_true",
                   help="replace the document of the model NAME if it exists (its owner or an admin may; its version "
                        "goes up by one), else create it")
    x.set_defaults(fn="model:cmd_model_create")
    x = add_command(models, "get", help="a stored model: owner, version, times, and its document as the daemon keeps "
                                      "it")
    x.add_argument("name", metavar="NAME", help="the model's name (`model list` lists them)")
    out(x)
    x.set_defaults(fn="model:cmd_model_get")
    x = add_command(models, "list", help="the stored models, by name: owner, version, what the document says")
    out(x)
    x.set_defaults(fn="model:cmd_model_list")
    x = models.add_parser("refit", help="add what jobs measured to a stored model and fit its cost model again on "
                                        "those made on hardware like its reference (docs/model-aware.md#feedback)")
    x.add_argument("name", metavar="NAME", help="the stored model")
    x.add_argument("--from-job", action="append", required=True, metavar="JOB", dest="jobs",
                   help="a model-aware job of this model whose running members reported their speed (repeatable)")
    x.set_defaults(fn="model:cmd_model_refit")
    x = add_command(models, "delete", help="delete a stored model (its owner or an admin)")
    x.add_argument("name", metavar="NAME", help="the model's name (`model list` lists them)")
    x.set_defaults(fn="model:cmd_model_delete")


def read_document(path: str) -> str:
    """The document in FILE (`-`: stdin), JSON or YAML, as the JSON text the API takes. InvalidArgument naming
    `-f` for a file that cannot be read or parsed."""
    import io
    import json

    from peloton.files import read_bounded, refuse_larger

    name = f"-f: {path}"
    try:
        if path == "-":  # bytes where there are (a test's stdin may be text): decoded as a file is
            stdin = getattr(sys.stdin, "buffer", None)
            raw: bytes | str = stdin.read(MAX_FILE_BYTES + 1) if stdin is not None else sys.stdin.read(
                MAX_FILE_BYTES + 1)
            refuse_larger(raw, MAX_FILE_BYTES, name, "a model document", field="-f")
        else:
            raw = read_bounded(path, MAX_FILE_BYTES, name, "a model document", field="-f")
    except OSError as e:
        raise InvalidArgument(f"-f: cannot read {path}: {e.strerror}", field="-f") from None
    try:
        text = raw if isinstance(raw, str) else io.TextIOWrapper(io.BytesIO(raw), encoding="utf-8").read()
    except UnicodeDecodeError:
        raise InvalidArgument(f"-f: {path} is not UTF-8 text", field="-f") from None
    try:
        doc = json.loads(text)
    except ValueError as e:
        if text.lstrip().startswith("["):  # neither YAML nor JSON would make a document of it
            raise InvalidArgument(f"-f: {path}: not valid JSON: {e}", field="-f") from None
        doc = _yaml(text, path, json_error=str(e) if text.lstrip().startswith("{") else "")
    try:
        return json.dumps(doc, allow_nan=False)
    except (TypeError, ValueError) as e:  # YAML's dates, sets, NaN: not JSON
        raise InvalidArgument(f"-f: {path}: not a JSON document: {e}", field="-f") from None


def _yaml(text: str, path: str, json_error: str) -> object:
    import re

    import yaml

    class Loader(yaml.SafeLoader):
        pass

    # YAML 1.1 reads 2.5e11 (no sign in the exponent, or no dot) as text; a model's flops are written that way
    Loader.add_implicit_resolver("tag:yaml.org,2002:float",
                                 re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$"),
                                 list("-+0123456789."))
    try:
        return yaml.load(text, Loader=Loader)  # noqa: S506 - a SafeLoader
    except (yaml.YAMLError, ValueError, TypeError, OverflowError, RecursionError, AttributeError) as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e) or type(e).__name__
        if json_error:
            raise InvalidArgument(f"-f: {path}: not valid JSON: {json_error}", field="-f") from None
        raise InvalidArgument(f"-f: {path}: not valid JSON or YAML{where}: {str(problem)[:200]}",
                              field="-f") from None


def cmd_model_create(c: Client, a: argparse.Namespace) -> int:
    from peloton.api.v1 import model_pb2

    document = read_document(a.file)
    r = c.call(c.models.CreateModel, model_pb2.CreateModelRequest(name=a.name, document_json=document,
                                                                  replace=a.replace))
    m = r.model
    from peloton.cli import render

    print(f"{'replaced' if r.replaced else 'created'} model {m.name} (version {m.version})", file=sys.stderr)
    render.done(a, {"name": m.name, "version": m.version, "replaced": r.replaced}, m.name)
    return 0


def model_dict(m: model_pb2.Model) -> dict[str, Any]:
    """A model's `-o json` form: the API's fields, with the document as a JSON object (`document`) rather than the
    text it travels as (`document_json`)."""
    import json

    from peloton.cli import render

    d = render.to_dict(m)
    d["document"] = json.loads(d.pop("document_json") or "null")
    return d


def cmd_model_get(c: Client, a: argparse.Namespace) -> int:
    import json

    from peloton.api.v1 import model_pb2
    from peloton.cli import render

    m = c.call(c.models.GetModel, model_pb2.GetModelRequest(name=a.name)).model
    if a.output in render.DOCUMENTS:
        print(render.dumps(model_dict(m)))
        return 0
    rows = [("model", m.name), ("owner", m.owner or "-"), ("version", str(m.version)),
            ("created", f"{render.rfc3339(m.created_at)} ({render.ago(m.created_at)})"),
            ("updated", f"{render.rfc3339(m.updated_at)} ({render.ago(m.updated_at)})"),
            ("describes", _summary(json.loads(m.document_json or "{}")))]
    print("\n".join(f"{k + ':':<11}{v}" for k, v in rows))
    print("document:")
    print(render.dumps(json.loads(m.document_json or "null")))
    return 0


def list_models(c: Client) -> list[model_pb2.Model]:
    """Every stored model, following the pages."""
    from peloton.api.v1 import model_pb2

    out: list[model_pb2.Model] = []
    token = ""
    while True:
        r = c.call(c.models.ListModels, model_pb2.ListModelsRequest(page_token=token))
        out += r.models
        token = r.next_page_token
        if not token:
            return out


def cmd_model_list(c: Client, a: argparse.Namespace) -> int:
    import json

    from peloton.cli import render

    models = list_models(c)
    if a.output in render.DOCUMENTS:
        print(render.dumps({"models": [model_dict(m) for m in models]}))
        return 0
    rows = []
    for m in models:
        doc = json.loads(m.document_json or "{}")
        rows.append([m.name, m.owner or "-", m.version, render.ago(m.updated_at), _summary(doc)])
    print(render.table(rows, ["NAME", "OWNER", "VERSION", "UPDATED", "DESCRIBES"]))
    return 0


def _summary(doc: dict[str, Any]) -> str:
    """What a document says, in a few words: `110M parameters, allreduce-ring; fitted on 30 rows (median error
    1.2%)`."""
    d = doc.get("description") or {}
    parts = []
    if d.get("parameters"):
        parts.append(f"{_count(d['parameters'])} parameters")
    elif d.get("parameter_bytes"):
        parts.append(f"{_count(d['parameter_bytes'])}B of gradients")
    parts.append(str(d.get("sync", "")) + (f" ({d['ps_count']} servers)" if isinstance(d.get("ps_count"), int)
                                          else ""))
    fit = doc.get("fit")
    if fit:
        what = f"fitted on {fit.get('rows', 0)} rows (median error {100 * float(fit.get('median_error', 0)):.1f}%)"
    elif doc.get("params"):
        what = "fitted"
    else:
        what = "not fitted (a prior from the description)"
    return f"{', '.join(p for p in parts if p)}; {what}"


def _count(n: float) -> str:
    for div, unit in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if n >= div:
            return f"{n / div:.3g}{unit}"
    return f"{n:g}"


def cmd_model_delete(c: Client, a: argparse.Namespace) -> int:
    from peloton.api.v1 import model_pb2

    c.call(c.models.DeleteModel, model_pb2.DeleteModelRequest(name=a.name))
    from peloton.cli import render

    print(f"deleted model {a.name}", file=sys.stderr)
    render.done(a, {"name": a.name, "deleted": True})
    return 0


def cmd_model_refit(c: Client, a: argparse.Namespace) -> int:
    """Read the model, add the jobs' measurements (predicted beside measured, and the hardware they ran on), fit
    again on the profile's rows and the measurements made on hardware like the model's reference (the others are
    recorded, not fitted: fit.unlike_reference), and replace the model if nobody changed it meanwhile."""
    import json

    from peloton.api.v1 import job_pb2, model_pb2
    from peloton.errors import FailedPrecondition
    from peloton.modelaware import document as docs
    from peloton.modelaware.cost import Reference
    from peloton.modelaware.fit import refit, split_measured, unlike_reference

    m = c.call(c.models.GetModel, model_pb2.GetModelRequest(name=a.name)).model
    doc = docs.parse_document(json.loads(m.document_json))
    base = doc.cost_params()
    ref, pattern = base.reference, doc.description.sync
    # each gang's measurement, and why it is not fitted ("": it is). One whose plan kept no hardware (placed by an
    # older daemon) is neither fitted nor recorded: recorded without it, it would read as made on the reference
    found: list[tuple[docs.Measurement, str]] = []
    for job_id in a.jobs:
        job = c.call(c.jobs.GetJob, job_pb2.GetJobRequest(job_id=job_id)).job
        if job.spec.model.name != a.name:
            raise FailedPrecondition(f"--from-job: job {job_id} is not a model-aware job of model {a.name!r}")
        for g in job.status.gangs:
            p = g.plan
            if g.HasField("plan") and p.measured_members and p.measured_step_time > 0:
                kinds = tuple(dict.fromkeys(Reference(h.gpu_model, h.nic_gbps, h.gpu_link) for h in p.hardware))
                x = docs.Measurement(job_id, tuple(p.gpus_per_host), p.local_bsz, p.measured_step_time, p.step_time,
                                     hardware=kinds)
                found.append((x, unlike_reference(x, ref, pattern) if kinds else _UNKNOWN))
    if not found:
        raise FailedPrecondition("--from-job: no running gang of these jobs has reported its speed yet (members "
                                 "write step_time=SECONDS to $PELOTON_METRICS_FILE)")
    recorded = [x for x, why in found if why != _UNKNOWN]
    if not recorded:
        raise FailedPrecondition("--from-job: the hardware the measured gangs ran on is not known (placed by an older "
                                 "daemon, whose plans did not keep it): nothing to record or fit; the plan of a gang "
                                 "placed since keeps it")
    keep = {(x.job_id, x.placement, x.local_bsz) for x in recorded}
    measured = (*[x for x in doc.measured if (x.job_id, x.placement, x.local_bsz) not in keep], *recorded)
    measured = measured[-docs.MAX_MEASURED:]
    used, left_out = split_measured(measured, ref, pattern)
    rows = len(doc.profile) + len(used)
    no_form = pattern == "ps"  # (a profile row does not say where its servers ran: the fit has no form for them)
    refitted = bool(used) and rows >= MIN_REFIT_ROWS and not no_form
    if refitted:
        result = refit(doc.profile, measured, ref, base, pattern)
        new = docs.ModelDocument(doc.name, doc.description, result.params,
                                 docs.FitInfo(result.rows, result.median_error, result.p90_error,
                                              (doc.fit.source if doc.fit else "") + " + measured"),
                                 tuple(measured), doc.profile)
    else:  # seven parameters from a handful of rows would fit those rows and nothing else
        new = docs.ModelDocument(doc.name, doc.description, doc.params, doc.fit, tuple(measured), doc.profile)
    from peloton.cli import render

    out = sys.stderr if a.output in render.DOCUMENTS else sys.stdout  # the record is then what stdout has
    for x, why in found:
        err = (x.step_time - x.predicted_step_time) / x.predicted_step_time * 100 if x.predicted_step_time else 0.0
        print(f"{x.job_id}: GPUs per host {','.join(map(str, x.placement))}, local batch {x.local_bsz:g}: "
              f"measured {x.step_time:.3f} s/step, predicted {x.predicted_step_time:.3f} (prediction off by "
              f"{err:+.0f}%)", file=out)
        if why == _UNKNOWN:
            print(f"  not recorded, not fitted: {why}", file=out)
        elif why:
            print(f"  left out of the fit (recorded in the model): it ran on {_hardware(x.hardware)}, unlike the "
                  f"model's reference: {why}", file=out)
    r = c.call(c.models.CreateModel, model_pb2.CreateModelRequest(
        name=a.name, document_json=json.dumps(docs.document_to_dict(new)), replace=True, if_version=m.version))
    reference = f"{ref.gpu_model}, {ref.nic_gbps:g} Gb/s, {ref.gpu_link}"
    if refitted:
        print(f"refitted model {a.name} on {result.rows} rows ({len(doc.profile)} of its profile, {len(used)} "
              f"measured): median error {result.median_error:.1%}, p90 {result.p90_error:.1%}; version "
              f"{r.model.version}", file=out)
    elif no_form:
        print(f"recorded the measurements in model {a.name} (version {r.model.version}); not refitted: the fit has "
              "no form for parameter servers yet (description.sync ps)", file=out)
    elif not used:
        print(f"recorded the measurements in model {a.name} (version {r.model.version}); not refitted: none of its "
              f"measurements was made on hardware like its reference ({reference})", file=out)
    else:
        print(f"recorded the measurements in model {a.name} (version {r.model.version}); not refitted: "
              f"{rows} rows in all, fewer than {MIN_REFIT_ROWS} (give it a profile: peloton model fit)", file=out)
    if left_out:
        n = len(left_out)
        print(f"{n} measurement{'s' if n > 1 else ''} made on hardware unlike the model's reference ({reference}) "
              "left out of the fit, kept in the model's measured list", file=out)
    render.done(a, {"name": a.name, "version": r.model.version, "refitted": refitted,
                    "measurements": [{"job_id": x.job_id, "placement": list(x.placement), "local_bsz": x.local_bsz,
                                      "step_time": x.step_time, "predicted_step_time": x.predicted_step_time,
                                      "hardware": [docs.hardware_to_dict(h) for h in x.hardware],
                                      "recorded": why != _UNKNOWN, "fitted": refitted and not why, "left_out": why}
                                     for x, why in found],
                    "left_out": len(left_out)})
    return 0


_UNKNOWN = "the hardware its gang ran on is not known (placed by an older daemon, whose plans did not keep it)"


def _hardware(kinds: tuple[Any, ...]) -> str:
    """`a100, 100 Gb/s, nvlink` (hosts of several kinds: `t4, 50 Gb/s, pcie and a100, 100 Gb/s, pcie`)."""
    return " and ".join(f"{h.gpu_model}, {h.nic_gbps:g} Gb/s, {h.gpu_link}" for h in kinds)
