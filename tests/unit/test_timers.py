"""The due-timer index: one entry per run, deadline order, stale entries handed back."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loopwarden.codecs import RunStarted, StepFinished, ToolCall
from loopwarden.codecs.events import Policy
from loopwarden.replay import Replay
from loopwarden.rules.timers import TimerQueue
from tests import strategies as S
from tests.unit.test_core_fast_paths import _both


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
    deadline moves: earlier, later (the entry stays, pushed again at the later deadline when it comes due), again."""
    q = TimerQueue()
    first = "run-" + str(7)  # built at run time: not the same object as an equal literal
    q.reschedule(first, 100)
    for again, deadline in ((500, 400), (300, 50), (250, 900)):
        other = "run-" + str(7)
        assert other is not first
        (q.schedule if again == 500 else q.reschedule)(other, deadline)
        assert q.held("run-7") is first
    q.reschedule("run-" + str(7), 2000)  # later, named by a new object: moved, not stood in for
    assert q.held("run-7") is first and q.queued["run-7"] == 2000
    assert [key for key in q.moved] == ["run-7"] and next(iter(q.moved)) is first  # no second object held
    assert list(q.pop_due(1999)) == []  # the old deadlines pop empty or superseded: nothing to load
    [(deadline, key)] = list(q.pop_due(2000))
    assert deadline == 2000 and key is first and q.held("run-7") is None and len(q) == 0


class _TightQueue(TimerQueue):
    """A queue rebuilt as soon as its stale entries outnumber its runs (no slack): the rebuild exercised."""

    __slots__ = ()
    stale_slack = 0


class _IndexedQueue(TimerQueue):
    """A queue whose buckets become dicts from their third run on: the indexed buckets exercised."""

    __slots__ = ()
    bucket_index_at = 2


def test_many_runs_at_one_deadline_are_found_and_fired_by_the_objects_they_were_queued_under() -> None:
    """5,000 runs fired at one clock share their next deadline: held() finds each one's own key object (in an
    indexed bucket, not by a scan), a run moved earlier and back keeps its object, and all fire once, in run order."""
    q = TimerQueue()
    keys = [f"run-{i:05d}".encode() for i in range(5000)]

    def equal(key: bytes) -> bytes:  # an equal key, another object (bytes(key) and b"" + key are key itself)
        other = key.decode().encode()
        assert other is not key
        return other

    for key in reversed(keys):
        q.reschedule(key, 1_000)
    assert q.buckets[1_000].__class__ is dict and len(q) == 5000
    assert all(q.held(equal(key)) is key for key in keys)
    q.reschedule(equal(keys[7]), 500)  # earlier: a new entry, the one at 1,000 stale
    q.reschedule(equal(keys[7]), 1_000)  # later again: the entry at 500 stays, pushed back to 1,000 when due
    assert q.held(keys[7]) is keys[7] and len(q) == 5001
    fired = list(q.pop_due(1_000))
    assert [d for d, _ in fired] == [1_000] * 5000 and [k for _, k in fired] == keys
    assert all(k is key for (_, k), key in zip(fired, keys)) and len(q) == 0 and not q.buckets


_OPS = st.lists(st.tuples(st.sampled_from(("schedule", "reschedule", "pop")), st.sampled_from("abcde"),
                          st.one_of(st.none(), st.integers(0, 60))), max_size=80)


@pytest.mark.parametrize("queue", [TimerQueue, _TightQueue, _IndexedQueue])
@given(ops=_OPS)
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_the_queue_agrees_with_a_plain_map_of_deadlines(queue, ops) -> None:
    """Any mix of earlier, later and dropped deadlines fires each run once at its last deadline, in (deadline, run)
    order, names it by the key object it was first queued under, and keeps stale entries bounded."""
    q, model, first, now, peak = queue(), {}, {}, 0, 0
    for op, run, deadline in ops:
        key = "".join([run])  # a new object each time, equal to the run id
        if op == "pop":
            now = deadline if deadline is not None else now
            due = sorted((d, r) for r, d in model.items() if d <= now)
            got = list(q.pop_due(now))
            assert got == due
            for d, r in got:
                assert r is first[r]
                del model[r]
            continue
        if op == "schedule" and deadline is not None and (run not in model or deadline < model[run]):
            q.schedule(key, deadline)
        elif op == "reschedule":
            q.reschedule(key, deadline)
        elif op == "schedule":
            q.schedule(key, deadline)  # no change: later than the one queued (looked at when that comes due)
            continue
        if deadline is None:
            model.pop(run, None)  # its entry stays until due, as a stale one
            continue
        if run not in model:
            first[run] = key
        model[run] = deadline
        assert q.held(run) is first[run]
        peak = max(peak, len(model))
        if queue is _TightQueue:  # stale entries rebuilt away once they outnumber the runs: never above the most runs
            assert len(q) <= 2 * peak
    assert q.queued == model
    assert len(q.moved) <= len(model) and len(q) >= len(model)
    assert list(q.pop_due(10**9)) == sorted((d, r) for r, d in model.items())
    assert len(q) == 0 and not q.heap and not q.buckets and not q.moved



@given(events=S.fleet(), advance_s=st.sampled_from([0.0, 400.0, 8 * 86400.0]))
@settings(max_examples=200, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
def test_replay_is_unchanged_when_the_queue_rebuilds_at_every_stale_push(monkeypatch, events, advance_s) -> None:
    """Rebuilds after every push that leaves a stale entry (some while fire_due pops) change no transition."""
    monkeypatch.setattr(TimerQueue, "stale_slack", -(10**9))
    fast, ref = _both(events, advance_s)
    assert fast == ref


def test_the_per_event_driver_applies_an_event_counts_its_notes_and_queues_its_runs_timer() -> None:
    """RunTable.step, which replay and the health task both call: the event reaches the core, its notes are
    counted in the shell's dict, the run's timer is queued on the event clock (not without ``schedule``), and a
    duplicate event is a note, no transition."""
    from loopwarden.rules import Settings
    from loopwarden.rules.machine import Result
    from loopwarden.rules.table import RunTable

    started = RunStarted(run_id="r", ts=1_000, agent="a", policy=Policy(version="v1", stop_when=[]))
    for schedule in (True, False):
        states: dict = {}
        table, res, noted = RunTable(Settings(), states.get), Result(None), {}
        new = states["r"] = table.step(res, None, started, 1_000, 1_000, noted, schedule)
        assert new.run_id == "r" and [t.to_state for t in res.transitions] == ["RUNNING"]
        assert table.due(10**12) is schedule  # its inactivity timer, queued only on the event clock
        res.transitions.clear()
        assert table.step(res, new, started, 1_000, 1_000, noted, schedule) is new and not res.transitions
        assert noted and not res.notes  # the duplicate's note is counted in the shell's dict, and taken out
