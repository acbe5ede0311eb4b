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
    """100,000 nested arrays on line 2 are one invalid line (no RecursionError); later lines still replay."""
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


def test_receipts_from_the_trusted_topic_count_unsigned_and_others_then_need_a_signature(tmp_path: Path) -> None:
    """`--trusted-receipts FILE`: its receipts count by channel (evidence names the topic), merged by ts into the
    other events (a's receipt, 100 s after its end, lands before c starts 700 s after it, so before a's 600 s
    receipt window runs out); an unsigned receipt among the ordinary lines then changes nothing, as on the worker."""
    a = timed(started(run="a"), step(0, run="a"), ended("natural_finish", 1, run="a"))
    b = timed(started(run="b"), step(0, run="b"), ended("natural_finish", 1, run="b"), start=1_000_500)
    end = a[2]["ts"]
    events, channel = tmp_path / "steps.jsonl", tmp_path / "verified.jsonl"
    events.write_text(_lines(a[0], b[0], a[1], b[1], a[2], b[2], receipt("rb", run="b", ts=b[2]["ts"] + 1000),
                             started(run="c", ts=end + 700_000)))
    channel.write_text(_lines(receipt("ra", run="a", ts=end + 100_000)))
    proc = subprocess.run([*LW, "replay", str(events), "--trusted-receipts", str(channel),
                           "--trusted-outcomes-topic", "lw.verified", "--advance-s", "700"],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    final = {}
    for line in proc.stdout.splitlines():
        t = json.loads(line)
        final[t["run_id"]] = t
    assert final["a"]["to_state"] == "VERIFIED_COMPLETE"
    assert final["a"]["evidence"]["receipt_trust"] == {"ra": "channel:lw.verified"}
    assert final["b"]["to_state"] == "FALSE_COMPLETE"  # its unsigned receipt did not count
    assert final["b"]["evidence"]["untrusted_receipt_ids"] == ["rb"]
    # The same channel file read after the ordinary lines (no merge) comes after a's window ran out: a passes through
    # FALSE_COMPLETE first. The merge is what keeps the worker's order.
    late = subprocess.run([*LW, "replay", str(events), str(channel), "--advance-s", "700"], capture_output=True,
                          text=True)
    states = [t["to_state"] for t in map(json.loads, late.stdout.splitlines()) if t["run_id"] == "a"]
    assert "FALSE_COMPLETE" in states
    assert "FALSE_COMPLETE" not in [t["to_state"] for t in map(json.loads, proc.stdout.splitlines()) if t["run_id"] == "a"]


def test_a_trusted_receipts_file_holds_receipts_only_and_the_topic_flag_needs_one(tmp_path: Path) -> None:
    """A step event on the trusted topic's file is an invalid line named by file and line; the topic flag alone
    stops the command with a message; '-' is refused for the channel."""
    events, channel = tmp_path / "steps.jsonl", tmp_path / "verified.jsonl"
    events.write_text(_lines(*timed(started(), step(0))))
    channel.write_text(_lines(receipt("rc", ts=1_000_500), step(1, ts=1_000_600)))
    proc = subprocess.run([*LW, "replay", str(events), "--trusted-receipts", str(channel)],
                          capture_output=True, text=True)
    assert proc.returncode == 1
    assert f"{channel}:2: invalid event (unknown_type)" in proc.stderr
    alone = subprocess.run([*LW, "replay", str(events), "--trusted-outcomes-topic", "x"], capture_output=True, text=True)
    assert alone.returncode != 0 and "give those files too" in alone.stderr
    dash = subprocess.run([*LW, "replay", str(events), "--trusted-receipts", "-"], capture_output=True, text=True,
                          input="")
    assert dash.returncode != 0 and "takes files, not '-'" in dash.stderr
