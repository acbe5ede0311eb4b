"""`loopwarden replay` as a command: files and stdin, bad lines, summary, exit status."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.builders import ended, receipt, started, step, timed

LW = [sys.executable, "-m", "loopwarden.cli"]


def _lines(*events) -> str:
    return "".join(json.dumps(e) + "\n" for e in events)


def test_invalid_lines_are_reported_with_line_number_and_skipped(tmp_path: Path) -> None:
    """A bad line is named by file and line; the good ones are classified; exit status is 1."""
    good = timed(started(), step(0), ended("natural_finish", 1), receipt("rc"))
    text = _lines(*good[:2]) + "\n" + '{"type":"step_finished","run_id":"r","ts":"x"}\n' + _lines(*good[2:]) + "{oops\n"
    f = tmp_path / "events.jsonl"
    f.write_text(text)
    proc = subprocess.run([*LW, "replay", str(f)], capture_output=True, text=True)
    assert proc.returncode == 1
    assert f"{f}:4: invalid event (invalid_field): Expected `int`, got `str` - at `$.ts`; got 'x'" in proc.stderr
    assert f"{f}:7: invalid event (undecodable)" in proc.stderr
    assert "2 invalid line(s) skipped" in proc.stderr
    final = [json.loads(line) for line in proc.stdout.splitlines()][-1]
    assert final["to_state"] == "VERIFIED_COMPLETE"


def test_stdin_and_dash_and_several_files(tmp_path: Path) -> None:
    """Files are read in order; '-' is stdin; exit 0 when every line is valid."""
    events = timed(started(), step(0), ended("natural_finish", 1))
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_text(_lines(events[0]))
    b.write_text(_lines(events[2]))
    proc = subprocess.run([*LW, "replay", str(a), "-", str(b), "--advance-s", "700"],
                          input=_lines(events[1]), capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    states = [json.loads(line)["to_state"] for line in proc.stdout.splitlines()]
    assert states == ["RUNNING", "VERIFYING", "FALSE_COMPLETE"]


def test_summary_table_on_stderr(tmp_path: Path) -> None:
    """--summary prints final states and reasons, counted, on stderr (stdout stays JSON lines)."""
    events = timed(started(run="a"), step(0, run="a"), ended("natural_finish", 1, run="a"),
                   started(run="b"), step(0, run="b"), ended("aborted", 1, run="b"))
    proc = subprocess.run([*LW, "replay", "--summary"], input=_lines(*events), capture_output=True, text=True)
    assert proc.returncode == 0
    assert "BOUNDED_STOP         aborted                         1" in proc.stderr
    assert "VERIFYING            natural_finish                  1" in proc.stderr
    for line in proc.stdout.splitlines():
        json.loads(line)


def test_missing_file_and_bad_flag_are_named(tmp_path: Path) -> None:
    """A missing file or a negative --advance-s is a clear error naming the value."""
    proc = subprocess.run([*LW, "replay", str(tmp_path / "nope.jsonl")], capture_output=True, text=True)
    assert proc.returncode != 0 and "nope.jsonl" in proc.stderr
    proc = subprocess.run([*LW, "replay", "--advance-s", "-3"], capture_output=True, text=True, input="")
    assert proc.returncode != 0 and "'-3'" in proc.stderr


def test_a_deeply_nested_line_is_skipped_and_later_lines_still_replay(tmp_path: Path) -> None:
    """100,000 nested arrays on line 2 once crashed replay with RecursionError; now it is one invalid line."""
    good = timed(started(), step(0), ended("natural_finish", 1), receipt("rc"))
    head = json.dumps(step(1))[:-1]
    deep = head + ', "x": ' + "[" * 100_000 + "]" * 100_000 + "}\n"
    f = tmp_path / "events.jsonl"
    f.write_text(_lines(good[0]) + deep + _lines(*good[1:]))
    proc = subprocess.run([*LW, "replay", str(f)], capture_output=True, text=True)
    assert proc.returncode == 1, proc.stderr
    assert f"{f}:2: invalid event (too_deep)" in proc.stderr
    assert "Traceback" not in proc.stderr
    final = [json.loads(line) for line in proc.stdout.splitlines()][-1]
    assert final["to_state"] == "VERIFIED_COMPLETE"
