"""Which ended sandboxes go (the pure rule): past the retention, then the oldest past the count and bytes bounds,
failed tasks' last."""

from __future__ import annotations

import random

from peloton.hostmgr.local.sandbox_retention import EndedSandbox, to_remove

NOW = 1_000_000.0


def box(name: str, age: float, size: int = 10, failed: bool = False) -> EndedSandbox:
    return EndedSandbox(name, NOW - age, size, failed)


def test_the_retention_alone_removes_what_ended_before_it() -> None:
    boxes = [box("old", 100.0), box("new", 10.0)]
    assert to_remove(boxes, NOW, 50.0, 0, 0) == ["old"]
    assert to_remove(boxes, NOW, 0.0, 0, 0) == []  # no age limit, no bound: everything kept


def test_past_the_count_the_oldest_go_and_failed_ones_last() -> None:
    boxes = [box("ok-old", 40), box("failed-oldest", 50, failed=True), box("ok-new", 10), box("failed-new", 5,
                                                                                               failed=True)]
    assert to_remove(boxes, NOW, 0.0, 3, 0) == ["ok-old"]
    assert to_remove(boxes, NOW, 0.0, 2, 0) == ["ok-old", "ok-new"]
    assert to_remove(boxes, NOW, 0.0, 1, 0) == ["ok-old", "ok-new", "failed-oldest"]
    assert to_remove(boxes, NOW, 0.0, 4, 0) == []


def test_past_the_bytes_bound_the_oldest_go_until_the_rest_fit() -> None:
    boxes = [box("a", 30, size=500), box("b", 20, size=300), box("c", 10, size=100)]
    assert to_remove(boxes, NOW, 0.0, 0, 900) == []
    assert to_remove(boxes, NOW, 0.0, 0, 899) == ["a"]
    assert to_remove(boxes, NOW, 0.0, 0, 99) == ["a", "b", "c"]


def test_the_bounds_count_only_what_the_retention_kept() -> None:
    boxes = [box("expired", 100, size=1000), box("a", 20), box("b", 10)]
    assert to_remove(boxes, NOW, 50.0, 2, 20) == ["expired"]


def test_what_remains_is_always_within_the_bounds_and_the_newest_non_failed_are_kept_over_older_ones() -> None:
    rng = random.Random(11)
    for _ in range(200):
        boxes = [box(f"t{i}", rng.uniform(0, 1000), rng.randint(0, 100), rng.random() < 0.3)
                 for i in range(rng.randint(0, 40))]
        retention, count, size = rng.choice([0.0, 500.0]), rng.randint(0, 20), rng.choice([0, 500, 2000])
        gone = set(to_remove(boxes, NOW, retention, count, size))
        kept = [b for b in boxes if b.name not in gone]
        assert not count or len(kept) <= count
        assert not size or sum(b.size for b in kept) <= size
        assert not retention or all(NOW - b.ended_at <= retention for b in kept)
        # nothing went that the rule did not need: a removed, unexpired, non-failed box is older than every kept
        # non-failed one
        for b in boxes:
            if b.name in gone and not (retention and NOW - b.ended_at > retention) and not b.failed:
                assert all(k.ended_at >= b.ended_at for k in kept if not k.failed)
