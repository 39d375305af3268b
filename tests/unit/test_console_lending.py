"""Who lends GPUs to whom in the pools view (peloton/console/lending.py, pure)."""

from __future__ import annotations

import pytest

from peloton.console.lending import PoolHolding, lending


def test_a_borrower_is_lent_by_its_idle_siblings_in_proportion_to_what_they_have_idle() -> None:
    out = lending([PoolHolding("/", 0, 24), PoolHolding("/a", 8, 20), PoolHolding("/b", 8, 2),
                   PoolHolding("/c", 8, 2)])
    assert out["/a"].borrows_from == pytest.approx({"/b": 6, "/c": 6}) and out["/a"].unreserved == 0
    assert out["/b"].lends_to == pytest.approx({"/a": 6}) and out["/c"].lends_to == pytest.approx({"/a": 6})
    assert out["/"].lends_to == {} and out["/"].borrows_from == {}  # the root is nobody's lender


def test_more_borrowed_than_lent_comes_from_unreserved_capacity_shared_by_the_borrowers() -> None:
    # /a and /b borrow 6 and 2 beyond their reservations; /c has 4 idle: 3 and 1 of it, the rest unreserved
    out = lending([PoolHolding("/a", 4, 10), PoolHolding("/b", 4, 6), PoolHolding("/c", 8, 4)])
    assert out["/a"].borrows_from == pytest.approx({"/c": 3}) and out["/a"].unreserved == pytest.approx(3)
    assert out["/b"].borrows_from == pytest.approx({"/c": 1}) and out["/b"].unreserved == pytest.approx(1)
    assert sum(out["/c"].lends_to.values()) == pytest.approx(4)  # never more than it has idle


def test_a_static_pool_lends_nothing_and_siblings_are_read_within_their_parent() -> None:
    out = lending([PoolHolding("/t", 16, 16), PoolHolding("/t/x", 4, 12), PoolHolding("/t/y", 8, 4),
                   PoolHolding("/s", 8, 0, static=True), PoolHolding("/u", 0, 0)])
    assert out["/t/x"].borrows_from == pytest.approx({"/t/y": 4}) and out["/t/x"].unreserved == pytest.approx(4)
    assert out["/s"].lends_to == {}  # its idle reservation is kept for it
    assert out["/t"].borrows_from == {} and out["/t"].unreserved == 0  # /t holds its reservation exactly
