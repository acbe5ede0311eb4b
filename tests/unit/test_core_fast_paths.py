"""The core's fast paths against the plain definitions they stand for.

``Replay.feed`` inlines the timer queue's checks, queues a run's new deadline at once
when its health changes (``TimerQueue.reschedule``). Here a reference replay written the slow, obvious way — before each
event, fire every due timer of every run, earliest deadline first, ties by run id,
by scanning all states — must produce exactly the same transitions, in the same
order, on generated fleets and on a simulated one.
"""

from __future__ import annotations

import msgspec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loopwarden.codecs import HealthTransition
from loopwarden.replay import Replay
from loopwarden.rules import DEFAULT_SETTINGS, apply, fire_next, next_deadline
from loopwarden.rules.timers import TimerQueue
from loopwarden.simulate import fleet
from tests import strategies as S


class ReferenceReplay:
    """Replay's contract with no index: O(runs) per event, obviously right."""

    def __init__(self) -> None:
        self.states: dict = {}
        self.clock: int | None = None

    def _fire_due(self) -> list[HealthTransition]:
        out: list[HealthTransition] = []
        while True:
            due = sorted(
                (d, run_id) for run_id, s in self.states.items()
                if (d := next_deadline(s, DEFAULT_SETTINGS)) is not None and d <= self.clock
            )
            if not due:
                return out
            _, run_id = due[0]
            res = fire_next(self.states[run_id], self.clock, DEFAULT_SETTINGS)
            if res.state is None:
                del self.states[run_id]
            else:
                self.states[run_id] = res.state
            out += res.transitions

    def feed(self, event) -> list[HealthTransition]:
        if self.clock is None or event.ts > self.clock:
            self.clock = event.ts
        out = self._fire_due()
        res = apply(self.states.get(event.run_id), event, self.clock, self.clock)  # placed at the clock if late
        self.states[event.run_id] = res.state
        return out + res.transitions + self._fire_due()  # a deadline the event set already past fires now

    def finish(self, advance_s: float) -> list[HealthTransition]:
        if self.clock is None:
            return []
        self.clock += int(round(advance_s * 1000))
        return self._fire_due()


def _both(events, advance_s: float) -> tuple[list, list]:
    fast, ref = Replay(), ReferenceReplay()
    a: list = []
    b: list = []
    for e in events:
        a += fast.feed(e)
        b += ref.feed(e)
    a += fast.finish(advance_s)
    b += ref.finish(advance_s)
    return a, b


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(S.fleet(), st.sampled_from([0.0, 30.0, 400.0, 1800.0, 8 * 86400.0, 40 * 86400.0]))
def test_replay_equals_the_reference_on_generated_fleets(events, advance_s) -> None:
    fast, ref = _both(events, advance_s)
    assert fast == ref


def test_replay_equals_the_reference_on_a_simulated_fleet() -> None:
    """300 simulated runs (every cause, receipts late and early, approvals): same transitions, same order."""
    from loopwarden.codecs import decode_input

    events = [decode_input(m.value) for m in fleet(300, seed=11) if m.valid]
    fast, ref = _both(events, 1800.0)
    assert len(fast) > 600
    assert fast == ref
    states = {t.to_state for t in fast}
    assert {"VERIFIED_COMPLETE", "FALSE_COMPLETE", "BOUNDED_STOP", "STUCK"} <= states


def test_reschedule_supersedes_the_queued_entry_without_handing_it_back() -> None:
    q = TimerQueue()
    q.schedule("r", 100)
    q.reschedule("r", 500)  # a later timer after a change of health
    assert len(q) == 1  # nothing pushed: the entry at 100 stands in for 500
    assert list(q.pop_due(200)) == []  # ... and is not handed back: it queues 500 instead
    assert len(q) == 1 and q.heap == [500]
    q.reschedule("r", 300)  # earlier works too: pushed, the entry at 500 superseded
    assert list(q.pop_due(1000)) == [(300, "r")]
    assert len(q) == 0
    q.schedule("s", 50)
    q.reschedule("s", None)  # no timer any more
    assert list(q.pop_due(1000)) == []


def test_a_standing_in_entry_queues_the_later_deadline_in_order() -> None:
    """Later deadlines recorded while an earlier entry stands in fire in deadline order, once."""
    q = TimerQueue()
    q.schedule("a", 10)
    q.reschedule("a", 40)
    q.reschedule("a", 70)  # still the entry at 10 stands in
    q.schedule("b", 50)
    q.schedule("c", 80)
    q.reschedule("b", 60)
    assert list(q.pop_due(100)) == [(60, "b"), (70, "a"), (80, "c")]
    assert len(q) == 0 and not q.queued


def test_an_entry_scheduled_while_popping_that_is_due_comes_out_in_the_same_pass() -> None:
    q = TimerQueue()
    q.schedule("a", 10)
    out = []
    for deadline, run_id in q.pop_due(100):
        out.append((deadline, run_id))
        if run_id == "a":
            q.schedule("b", 10)  # the same, already popped, deadline
            q.schedule("c", 50)
    assert out == [(10, "a"), (10, "b"), (50, "c")]


def _deadline_keeping_holds(events) -> int:
    """Apply ``events``; at every DEADLINE_KEEPING event that kept its state and made no transition,
    the run's next deadline must not have moved earlier (nor appeared). Returns the events checked."""
    from loopwarden.rules.machine import DEADLINE_KEEPING

    states: dict = {}
    clock = None
    checked = 0
    for e in events:
        clock = e.ts if clock is None else max(clock, e.ts)
        state = states.get(e.run_id)
        before = None if state is None else next_deadline(state, DEFAULT_SETTINGS)
        res = apply(state, e, clock)
        states[e.run_id] = res.state
        if type(e) in DEADLINE_KEEPING and res.state is state and not res.transitions:
            after = next_deadline(state, DEFAULT_SETTINGS)
            assert after is None or (before is not None and after >= before), (e, before, after)
            checked += 1
    return checked


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(S.fleet())
def test_deadline_keeping_events_never_move_a_deadline_earlier(events) -> None:
    """Replay.feed skips the timer queue after these events (machine.DEADLINE_KEEPING): the claim itself."""
    _deadline_keeping_holds(events)


def test_deadline_keeping_events_never_move_a_deadline_earlier_on_a_simulated_fleet() -> None:
    from loopwarden.codecs import decode_input

    events = [decode_input(m.value) for m in fleet(300, seed=5) if m.valid]
    assert _deadline_keeping_holds(events) > 1000


def test_the_events_left_out_of_deadline_keeping_can_move_a_deadline_earlier() -> None:
    """Why run_started and approval_routed are not in DEADLINE_KEEPING (and that the check above can fail)."""
    import pytest

    from loopwarden.codecs import decode_input
    from loopwarden.rules import machine
    from tests.builders import approval, ended, routed, started, step, timed

    def decoded(*events):
        return [decode_input(msgspec.json.encode(e)) for e in timed(*events)]

    # a late run_started sets a shorter inactivity timeout; a routed approval an earlier deadline
    late_policy = decoded(step(0, ("lookup", "result")), started(inactivity_timeout_s=5))
    earlier_approval = decoded(step(0, ("pay", "approval_requested")),
                               ended("approval_required", 1, approval=approval(deadline_ts=9_000_000)),
                               routed(deadline_ts=2_000_000))
    for events in (late_policy, earlier_approval):
        _deadline_keeping_holds(events)  # holds as DEADLINE_KEEPING is
        wider = machine.DEADLINE_KEEPING | {type(events[-1])}
        try:
            machine.DEADLINE_KEEPING, saved = wider, machine.DEADLINE_KEEPING
            with pytest.raises(AssertionError):
                _deadline_keeping_holds(events)
        finally:
            machine.DEADLINE_KEEPING = saved
