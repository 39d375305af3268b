"""Job ids given by a unique prefix: `peloton job get 3f2a` is the job whose id starts with 3f2a, when only one
job's does.

Resolved here, in the CLI, not in the daemon: the API keeps taking whole ids only (a script or another client never
acts on a job it did not name in full, and no RPC's meaning changes), and a whole id, what scripts pass, costs
nothing more: only an id shorter than the daemon's 12 characters is looked up, by one ListJobs page filtered on the
daemon by `id_prefix` (a daemon too old to know that filter answers unfiltered: then every job is listed)."""

from __future__ import annotations

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (start-up time: see parser.py)
if TYPE_CHECKING:
    import argparse

    from peloton.cli.client import Client

ID_CHARS = 12  # the daemon's job ids: 12 hex characters (jobmgr/manager.py: uuid4().hex[:12])
SHOWN = 10  # candidates an ambiguous prefix's error names


def is_prefix(given: str) -> bool:
    """Whether `given` can only be a prefix: shorter than an id, and hex as ids are. Anything else is passed on
    as it is (the daemon says whether such a job exists)."""
    return 0 < len(given) < ID_CHARS and all(ch in "0123456789abcdef" for ch in given)


def resolve_args(c: Client, a: argparse.Namespace) -> None:
    """Every job id of the parsed command (`job_id`, `job_ids`, `model refit --from-job`) made whole."""
    for dest in ("job_id", "job_ids", "jobs"):
        value = getattr(a, dest, None)
        if isinstance(value, str) and is_prefix(value):
            setattr(a, dest, resolve(c, value, dest))
        elif isinstance(value, list) and any(isinstance(v, str) and is_prefix(v) for v in value):
            setattr(a, dest, [resolve(c, v, dest) if is_prefix(v) else v for v in value])


def resolve(c: Client, prefix: str, field: str = "job_id") -> str:
    """The one job id that starts with `prefix`; NotFound when none does, InvalidArgument naming the candidates
    when several do."""
    from peloton.api.v1 import job_pb2
    from peloton.cli.jobs import list_jobs
    from peloton.errors import InvalidArgument, NotFound

    page = c.call(c.jobs.ListJobs, job_pb2.ListJobsRequest(id_prefix=prefix, page_size=SHOWN + 1))
    more = bool(page.next_page_token)
    ids = [j.id for j in page.jobs]
    if not all(i.startswith(prefix) for i in ids):  # a daemon that ignores id_prefix: every job, filtered here
        ids, more = [j.id for j in list_jobs(c, [], "", "", 0)], False
    matches = [i for i in ids if i.startswith(prefix)]
    if len(matches) == 1 and not more:
        return matches[0]
    if not matches:
        raise NotFound(f"{field}: no job's id starts with {prefix!r}", field=field)
    if more or len(matches) > SHOWN:
        raise InvalidArgument(f"{field}: {prefix!r} is the start of more than {SHOWN} job ids: "
                              f"{', '.join(matches[:SHOWN])}, ... (give more of the id)", field=field)
    raise InvalidArgument(f"{field}: {prefix!r} is the start of {len(matches)} job ids: {', '.join(matches)} (give "
                          "more of the id)", field=field)
