"""What members report of their speed: parsed from the tail of their metrics file, numbers only."""

from __future__ import annotations

from peloton.modelaware.metrics import Report, combine, parse


def test_the_last_line_with_a_figure_counts() -> None:
    data = b"step_time=0.9\nstep_time=0.5 local_bsz=32\nepoch 3 done\n"
    assert parse(data) == Report(step_time=0.5, local_bsz=32)
    assert parse(b"samples_per_s=120.5\n") == Report(samples_per_s=120.5)


def test_nothing_but_numbers_is_read() -> None:
    assert parse(b"root:x:0:0:root:/root:/bin/bash\n") is None
    assert parse(b"step_time=nan step_time=-1 step_time=inf\n") is None
    assert parse(b"") is None
    assert parse(b"step_time=abc\nstep_time=0.25 junk=1\n") == Report(step_time=0.25)
    assert parse(b"\xff\xfe step_time=0.5") == Report(step_time=0.5)


def test_the_gang_figures() -> None:
    # step times only: the gang's rate is gpus x local batch / mean step time
    m = combine([Report(step_time=0.5), Report(step_time=0.7)], gpus=8, local_bsz=32)
    assert m is not None and m.members == 2
    assert abs(m.step_time - 0.6) < 1e-9 and abs(m.samples_per_s - 8 * 32 / 0.6) < 1e-9
    # each member's own rate, for every member
    m = combine([Report(samples_per_s=100.0, local_bsz=32), Report(samples_per_s=110.0)], gpus=4, local_bsz=32)
    assert m is not None and abs(m.samples_per_s - 420.0) < 1e-9 and abs(m.step_time - 4 * 32 / 420.0) < 1e-9
    assert combine([], gpus=4, local_bsz=32) is None
