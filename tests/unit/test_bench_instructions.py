"""Bench i's arithmetic: cachegrind's total read from its output file, startup taken out by two backlogs."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.instructions import Count, instructions_of, per_event

# The shape of a `valgrind --tool=cachegrind --cache-sim=no` output file (valgrind 3.19, /usr/bin/true).
SAMPLE = b"""desc: I1 cache:         32768 B, 64 B, 8-way associative
cmd: /usr/bin/true
events: Ir
fl=./csu/../csu/libc-start.c
fn=__libc_start_main@@GLIBC_2.34
128 2
fn=???
0 131
summary: 127601
"""


def test_the_total_is_the_summary_line(tmp_path: Path) -> None:
    out = tmp_path / "cachegrind.out"
    out.write_bytes(SAMPLE)
    assert instructions_of(out) == 127_601


def test_a_file_without_a_summary_is_an_error_naming_it(tmp_path: Path) -> None:
    out = tmp_path / "cut.out"
    out.write_bytes(SAMPLE.rsplit(b"summary", 1)[0])
    with pytest.raises(ValueError, match="cut.out"):
        instructions_of(out)


def test_one_more_event_costs_the_difference_over_the_events_between() -> None:
    # startup 3.0 G in both; 80,000 instructions an event
    small, large = Count("worker", 10_000, 3_000_000_000 + 800_000_000), Count("worker", 100_000, 3_000_000_000 + 8_000_000_000)
    assert per_event(small, large) == 80_000
    with pytest.raises(ValueError, match="10000"):
        per_event(small, small)
