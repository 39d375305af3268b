"""Profiles: measured step times of a few placements.

A profile is CSV with the header `placement,local_bsz,step_time[,sync_time]` (the format of the Pollux artifact's
`placements.csv`, shared/data/public/adaptdl). `placement` is the number of GPUs used on each host, written as
digits (`1134`: four hosts with 1, 1, 3 and 4 GPUs) or comma-separated (`1,1,3,4`; needed past 9 GPUs on a host).
`local_bsz` is the batch per GPU of one step, `step_time` one step's seconds, `sync_time` the part of it spent
synchronising gradients (optional; not used by the fit, which explains step_time alone).
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from peloton.errors import InvalidArgument

MAX_PROFILE_ROWS = 100_000
MAX_HOSTS_IN_PLACEMENT = 4096
MAX_GPUS_PER_HOST = 256
COLUMNS = ("placement", "local_bsz", "step_time", "sync_time")
REQUIRED = COLUMNS[:3]


@dataclass(frozen=True, slots=True)
class ProfileRow:
    placement: tuple[int, ...]  # GPUs used on each host used, hosts with none left out
    local_bsz: float
    step_time: float
    sync_time: float | None = None

    @property
    def gpus(self) -> int:
        return sum(self.placement)


def parse_placement(text: str, field: str = "placement") -> tuple[int, ...]:
    """`1134` or `1,1,3,4` -> (1, 1, 3, 4). Hosts with 0 GPUs are left out; at least one GPU in all."""
    t = text.strip()
    if not t:
        raise InvalidArgument(f"{field}: empty (expected GPUs per host, like 1134 or 1,1,3,4)", field=field)
    parts = [p.strip() for p in t.split(",")] if "," in t else list(t)
    out = []
    for p in parts:
        if not p.isdigit() or not p.isascii():
            raise InvalidArgument(f"{field}: {text!r} is not GPUs per host (digits like 1134, or 1,1,3,4)",
                                  field=field)
        n = int(p)
        if n > MAX_GPUS_PER_HOST:
            raise InvalidArgument(f"{field}: {n} GPUs on one host is more than {MAX_GPUS_PER_HOST}", field=field)
        if n:
            out.append(n)
    if not out:
        raise InvalidArgument(f"{field}: {text!r} uses no GPU", field=field)
    if len(out) > MAX_HOSTS_IN_PLACEMENT:
        raise InvalidArgument(f"{field}: more than {MAX_HOSTS_IN_PLACEMENT} hosts", field=field)
    return tuple(out)


def format_placement(placement: tuple[int, ...]) -> str:
    """The digits form when every host has at most 9 GPUs, else comma-separated."""
    if all(g <= 9 for g in placement):
        return "".join(str(g) for g in placement)
    return ",".join(str(g) for g in placement)


def _number(text: str, where: str, column: str, *, allow_zero: bool = False) -> float:
    try:
        v = float(text)
    except ValueError:
        raise InvalidArgument(f"{where}, column {column}: expected a number, got {text!r}", field=column) from None
    if not math.isfinite(v) or v < 0 or (v == 0 and not allow_zero):
        raise InvalidArgument(f"{where}, column {column}: expected a {'non-negative' if allow_zero else 'positive'} "
                              f"number, got {text!r}", field=column)
    return v


def csv_rows(text: str, source: str, known: tuple[str, ...], required: int, max_rows: int, field: str = "header",
             ) -> Iterator[tuple[str, dict[str, str]]]:
    """Each data row of a CSV table as (where: "SOURCE: row N (line L)", its cells by column, stripped). The
    header may hold `known`'s columns in any order, and must hold its first `required`; blank lines are skipped.
    A wrong header, a row of another width, or more than `max_rows` rows are refused naming the source (and
    `field` as the error's field for what is not one row's)."""
    expected = ",".join(known[:required]) + (f"[,{','.join(known[required:])}]" if known[required:] else "")
    reader = csv.reader(io.StringIO(text))
    try:
        header = [h.strip() for h in next(reader)]
    except StopIteration:
        raise InvalidArgument(f"{source}: empty (expected the header {expected})", field=field) from None
    unknown = [c for c in header if c not in known]  # first: a misspelt column is also a missing one
    if unknown:
        raise InvalidArgument(f"{source}: header: unknown column {unknown[0]!r} (known: {', '.join(known)})",
                              field=field)
    twice = [c for i, c in enumerate(header) if c in header[:i]]
    if twice:  # which of the two would a row's value be? (a dict of the cells kept the last, silently)
        raise InvalidArgument(f"{source}: header: column {twice[0]!r} twice", field=field)
    missing = [c for c in known[:required] if c not in header]
    if missing:
        raise InvalidArgument(f"{source}: header has no {', '.join(missing)} column (expected {expected}, got "
                              f"{','.join(header)!r})", field=field)
    seen = 0
    for n, rec in enumerate(_records(reader, source), start=1):
        if not rec or all(not c.strip() for c in rec):
            continue
        where = f"{source}: row {n} (line {reader.line_num})"
        if len(rec) != len(header):
            raise InvalidArgument(f"{where}: {len(rec)} columns, the header has {len(header)}", field="row")
        seen += 1
        if seen > max_rows:
            raise InvalidArgument(f"{source}: more than {max_rows} rows", field="row")
        yield where, {c: rec[i].strip() for i, c in enumerate(header)}
    if not seen:
        raise InvalidArgument(f"{source}: no rows after the header", field="row")


def _records(reader: Any, source: str) -> Iterator[list[str]]:
    """The csv reader's records; what it cannot read (a cell over its field size limit) refused naming the row
    and line it stopped at, as a bad row is, not as the csv module's own error."""
    n = 0
    while True:
        try:
            rec = next(reader)
        except StopIteration:
            return
        except csv.Error as e:
            raise InvalidArgument(f"{source}: row {n + 1} (line {reader.line_num}): {e}", field="row") from None
        n += 1
        yield rec


def read_profile(text: str, source: str = "profile") -> list[ProfileRow]:
    """Every row of a profile's CSV text; a bad row is refused naming the source, the row (1 = the first after the
    header; the file's line is that + 1) and the column."""
    rows: list[ProfileRow] = []
    for where, cell in csv_rows(text, source, COLUMNS, len(REQUIRED), MAX_PROFILE_ROWS):
        try:
            placement = parse_placement(cell["placement"], "placement")
        except InvalidArgument as e:
            raise InvalidArgument(f"{where}, column {e.message}", field="placement") from None
        bsz = _number(cell["local_bsz"], where, "local_bsz")
        step = _number(cell["step_time"], where, "step_time")
        sync = None
        if cell.get("sync_time"):
            sync = _number(cell["sync_time"], where, "sync_time", allow_zero=True)
            if sync > step:
                raise InvalidArgument(f"{where}, column sync_time: {sync:g} s is more than step_time ({step:g} s)",
                                      field="sync_time")
        rows.append(ProfileRow(placement, bsz, step, sync))
    return rows


def select(rows: list[ProfileRow], placements: set[tuple[int, ...]]) -> list[ProfileRow]:
    """The rows of the given placements (as multisets of GPUs per host: 1134 and 4311 are the same)."""
    want = {tuple(sorted(p)) for p in placements}
    return [r for r in rows if tuple(sorted(r.placement)) in want]
