"""Profiles: the CSV `placement,local_bsz,step_time[,sync_time]` (peloton/modelaware/profile.py)."""

from __future__ import annotations

import pytest

from peloton.errors import InvalidArgument
from peloton.modelaware.profile import ProfileRow, format_placement, parse_placement, read_profile, select
from tests.unit.modelaware_data import profile


@pytest.mark.parametrize(("text", "expected"), [
    ("1134", (1, 1, 3, 4)),
    ("1,1,3,4", (1, 1, 3, 4)),
    (" 4 ", (4,)),
    ("10,2", (10, 2)),
    ("1034", (1, 3, 4)),  # a host with no GPU is not part of the placement
    ("0,8,0", (8,)),
    ("256", (2, 5, 6)),  # digits: one host each
    ("256,1", (256, 1)),
])
def test_placements_in_digits_or_comma_form(text: str, expected: tuple[int, ...]) -> None:
    assert parse_placement(text) == expected


@pytest.mark.parametrize(("text", "why"), [
    ("", "empty"), ("000", "uses no GPU"), ("0,0", "uses no GPU"), ("12x", "is not GPUs per host"),
    ("1,,2", "is not GPUs per host"), ("1,-2", "is not GPUs per host"), ("257,1", "more than 256"),
    ("١٢", "is not GPUs per host"),  # other scripts' digits are not digits here
])
def test_bad_placements_are_refused_naming_the_field(text: str, why: str) -> None:
    with pytest.raises(InvalidArgument) as e:
        parse_placement(text, "--placement")
    assert e.value.field == "--placement" and why in e.value.message and e.value.message.startswith("--placement: ")


def test_format_placement_uses_digits_when_it_can() -> None:
    assert format_placement((1, 1, 3, 4)) == "1134"
    assert format_placement((10, 2)) == "10,2"
    assert parse_placement(format_placement((10, 2))) == (10, 2)


def test_a_profile_reads_every_row_with_and_without_sync_time() -> None:
    # the comma form is quoted in CSV; an empty sync_time is no measurement; blank lines are skipped
    rows = read_profile('placement,local_bsz,step_time,sync_time\n1,4,0.5,0.01\n0104,8,1.25,\n\n"1,1,3,4",16,2,1.5\n')
    assert rows == [ProfileRow((1,), 4.0, 0.5, 0.01), ProfileRow((1, 4), 8.0, 1.25, None),
                    ProfileRow((1, 1, 3, 4), 16.0, 2.0, 1.5)]
    assert rows[2].gpus == 9
    # columns in any order; sync_time optional
    assert read_profile("step_time,placement,local_bsz\n0.5,22,4\n") == [ProfileRow((2, 2), 4.0, 0.5)]


@pytest.mark.parametrize(("text", "field", "words"), [
    ("", "header", "empty"),
    ("placement,local_bsz\n1,4\n", "header", "no step_time column"),
    ("placement,local_bsz,step_time,gpus\n1,4,1,1\n", "header", "unknown column 'gpus'"),
    ("placement,local_bsz,step_time\n", "row", "no rows"),
    ("placement,local_bsz,step_time\n1,4,0.5\n1,4\n", "row", "row 2 (line 3): 2 columns"),
    ("placement,local_bsz,step_time\n1,4,0.5\n1x,4,0.5\n", "placement", "row 2 (line 3), column placement"),
    ("placement,local_bsz,step_time\n1,4,0.5\n0,4,0.5\n", "placement", "row 2 (line 3), column placement"),
    ("placement,local_bsz,step_time\n1,four,0.5\n", "local_bsz", "row 1 (line 2), column local_bsz"),
    ("placement,local_bsz,step_time\n1,4,0\n", "step_time", "row 1 (line 2), column step_time: expected a positive"),
    ("placement,local_bsz,step_time\n1,4,nan\n", "step_time", "row 1 (line 2), column step_time"),
    ("placement,local_bsz,step_time,sync_time\n1,4,0.5,-1\n", "sync_time", "row 1 (line 2), column sync_time"),
    ("placement,local_bsz,step_time,sync_time\n11,4,0.5,0.6\n", "sync_time",
     "row 1 (line 2), column sync_time: 0.6 s is more than step_time (0.5 s)"),
])
def test_bad_profiles_are_refused_naming_the_row_and_column(text: str, field: str, words: str) -> None:
    with pytest.raises(InvalidArgument) as e:
        read_profile(text, source="p.csv")
    assert e.value.field == field
    assert e.value.message.startswith("p.csv: ") and words in e.value.message, e.value.message


def test_sync_time_equal_to_step_time_is_allowed() -> None:
    assert read_profile("placement,local_bsz,step_time,sync_time\n11,4,0.5,0.5\n")[0].sync_time == 0.5


def test_select_takes_placements_as_multisets() -> None:
    rows = read_profile("placement,local_bsz,step_time\n14,4,1\n41,4,1.1\n44,4,2\n4,4,0.5\n")
    assert [r.step_time for r in select(rows, {(4, 1)})] == [1, 1.1]
    assert [r.step_time for r in select(rows, {(4,), (4, 4)})] == [2, 0.5]


def test_the_public_profiles_read_whole() -> None:
    """bert and cifar10 of the Pollux artifact (SOURCES.md: 540 and 1,183 rows), every multiset of up to 4 hosts
    of up to 4 GPUs (69) with several local batches."""
    for app, n, bszs in (("bert", 540, 5), ("cifar10", 1183, 11)):
        rows = profile(app)
        assert len(rows) == n
        assert len({tuple(sorted(r.placement)) for r in rows}) == 69
        assert len({r.local_bsz for r in rows}) == bszs
        assert all(r.sync_time is not None and r.sync_time <= r.step_time for r in rows)
