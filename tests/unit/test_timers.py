"""The due-timer index: one entry per run, deadline order, stale entries handed back."""

from __future__ import annotations

from loopwarden.codecs import RunStarted, StepFinished, ToolCall
from loopwarden.codecs.events import Policy
from loopwarden.replay import Replay
from loopwarden.rules.timers import TimerQueue


def test_entries_follow_runs_not_events() -> None:
    """A deadline that only moves later adds no entry; an earlier one does."""
    q = TimerQueue()
    for d in range(1000, 2000):
        q.schedule("r", d)
    assert len(q) == 1
    q.schedule("r", 500)
    assert len(q) == 2
    assert list(q.pop_due(10_000)) == [(500, "r")]  # the superseded 1000 entry is dropped


def test_pop_due_in_deadline_order_and_only_due() -> None:
    """Due entries come out earliest first, ties by run id; later ones stay."""
    q = TimerQueue()
    for run, d in (("b", 30), ("a", 30), ("c", 10), ("d", 99)):
        q.schedule(run, d)
    assert list(q.pop_due(50)) == [(10, "c"), (30, "a"), (30, "b")]
    assert list(q.pop_due(50)) == []
    assert list(q.pop_due(99)) == [(99, "d")]


def test_a_long_run_keeps_one_timer_entry_in_replay() -> None:
    """10,000 steps of one run leave one queued inactivity timer, not 10,000."""
    replay = Replay()
    replay.feed(RunStarted(run_id="r", ts=0, agent="a", policy=Policy(version="v", stop_when=())))
    for i in range(10_000):
        replay.feed(StepFinished(run_id="r", ts=i, step=i, finish_reason="tool-calls",
                                 tool_calls=(ToolCall(id="t", name="x", status="result"),)))
    assert len(replay._timers) == 1
    out = replay.finish(301)
    assert [(t.to_state, t.reason, t.ts) for t in out] == [("STUCK", "no_progress", 9_999 + 300_000)]


def test_a_run_keeps_one_key_object_whatever_moves_its_deadline() -> None:
    """Every entry of a run holds the key object it was first queued under (held() returns it), however its
    deadline moves: earlier, later (the entry moves to the later bucket, the old deadline pops empty), again."""
    q = TimerQueue()
    first = "run-" + str(7)  # built at run time: not the same object as an equal literal
    q.reschedule(first, 100)
    for again, deadline in ((500, 400), (300, 50), (250, 900)):
        other = "run-" + str(7)
        assert other is not first
        (q.schedule if again == 500 else q.reschedule)(other, deadline)
        assert q.held("run-7") is first
    q.reschedule("run-7", 2000)  # later: moved, not stood in for
    assert q.held("run-7") is first and q.queued["run-7"] == 2000
    assert list(q.pop_due(1999)) == []  # the old deadlines pop empty or superseded: nothing to load
    [(deadline, key)] = list(q.pop_due(2000))
    assert deadline == 2000 and key is first and q.held("run-7") is None and len(q) == 0
