"""Pool paths as a tree: a pool's chain up to the root, and sums of per-pool figures over subtrees. Pure.

The bottom of the resource manager's cores: admission, entitlement, preemption and holdings all walk a pool's
ancestors, so the walk lives below them (it lived in admission.py, and entitlement.py importing it from there
closed an import circle with admission.py's use of `Entitlement`).
"""

from __future__ import annotations

import functools
from collections.abc import Container, Mapping

from peloton.domain.resources import Resources


def ancestors(path: str) -> list[str]:
    """'/a/b' -> ['/a/b', '/a', '/']."""
    return list(chain(path))


@functools.lru_cache(maxsize=65536)
def chain(path: str) -> tuple[str, ...]:
    """ancestors() as a tuple, remembered (admission walks it for every waiting gang every round)."""
    out = [path]
    while path != "/":
        path = path.rsplit("/", 1)[0] or "/"
        out.append(path)
    return tuple(out)


def add(book: dict[str, Resources], key: str, r: Resources, counts: dict[str, int] | None = None) -> None:
    """Add `r` to `book[key]`; `counts` (when the book keeps them): how many amounts each figure holds."""
    book[key] = book.get(key, Resources()) + r
    if counts is not None:
        counts[key] = counts.get(key, 0) + 1


def sub(book: dict[str, Resources], key: str, r: Resources, counts: dict[str, int] | None = None) -> None:
    """Take `r` from `book[key]`; a figure that falls to (about) zero is dropped, so the book lists only holders.
    With `counts` (`add`'s), a figure is dropped, exactly, when its last amount is taken: float sums of inexact
    quantities (0.1 cores, 1.1Gi) taken away in another order than added leave a residue (5e-9 MiB after 3,000
    gangs) that no threshold tells from a small holder, and it would stay for ever."""
    if counts is not None:
        n = counts.get(key, 0) - 1
        if n <= 0:
            counts.pop(key, None)
            book.pop(key, None)
            return
        counts[key] = n
    rest = book.get(key, Resources()) - r
    if rest.cpu <= 1e-9 and rest.mem <= 1e-9 and rest.disk <= 1e-9 and rest.gpu <= 0 and rest.ports <= 0:
        book.pop(key, None)
    else:
        book[key] = rest


def subtree_sums(own: Mapping[str, Resources], pools: Container[str]) -> dict[str, Resources]:
    """Each pool's figure with its descendants' (`own`: per pool, its own); unknown ancestors are skipped."""
    out: dict[str, Resources] = {}
    for path, r in own.items():
        for p in chain(path):
            if p in pools or p == path:
                add(out, p, r)
    return out
