"""One notion of event time in both shells (docs/contract.md section 5, "Over time").

Replay and the worker's health stage (``PartitionTask`` on the event clock) must end in the same
states for any order of arrival, late events included, and events older than the clock by more
than a timeout open a fresh window rather than timing their run out at once. No Kafka here: what
is under test is the pure fold of a partition's records and its timers, which Kafka only carries
(tests/unit/test_task.py's harness; the same stage the engine runs).

``LOOPWARDEN_EVENT_TIME_FLEETS`` sets how many fleets the property folds (``make soak``: 10,000).
"""

from __future__ import annotations

import os
from collections import defaultdict

import msgspec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loopwarden.codecs import OutcomeExpected, OutcomeReceipt, decode_input, encode
from loopwarden.replay import Replay
from loopwarden.rules import Settings, encode_state
from loopwarden.engine.store import MemoryPartition
from loopwarden.stages.health.task import PartitionTask, Tick, encode_tick, is_meta
from tests.strategies import fleet
from tests.builders import Rec, ended, receipt, started, step

ROLES = {"agent.steps": "steps", "agent.outcomes": "outcomes", "loopwarden.ticks": "ticks"}
FLEETS = int(os.environ.get("LOOPWARDEN_EVENT_TIME_FLEETS", "300"))
ADVANCE_MS = 40 * 86_400_000  # past retention (7 days) and the tombs' memory (30 days): every timer runs out
SEED = "tests/cases/seed-eleven.jsonl"


def _topic(event) -> str:
    return "agent.outcomes" if isinstance(event, (OutcomeReceipt, OutcomeExpected)) else "agent.steps"


def _task(clock: str = "event", wall=None) -> tuple[MemoryPartition, PartitionTask]:
    """Partition 0's health stage on a memory store, rebuilt (empty), its wall clock far ahead unless given."""
    store = MemoryPartition()
    task = PartitionTask(0, store, ROLES, settings=Settings(), clock=clock,
                         wall_ms=wall or (lambda: 2**53 - 1), max_future_ms=2**53)
    task.rebuild()
    return store, task


def worker(arrivals, cuts, clock: str = "event", wall=None):
    """The partition's stage over ``arrivals`` in batches cut at ``cuts`` (a batch never mixes topics,
    so its order is the arrival order), committed one by one; then a tick past every timer."""
    store, task = _task(clock, wall)
    offsets: dict[str, int] = defaultdict(int)
    transitions = []

    def commit(records, punctuate=False):
        out = task.fold(records, punctuate=punctuate)
        assert not out.deadletters
        transitions.extend(out.transitions)
        store.write(out.changes, None)
        task.committed(out)

    batch: list[Rec] = []
    for i, event in enumerate(arrivals):
        topic = _topic(event)
        if batch and (i in cuts or batch[-1].topic != topic):
            commit(batch, punctuate=True)
            batch = []
        batch.append(Rec(topic, 0, offsets[topic], event.run_id.encode(), encode(event)))
        offsets[topic] += 1
    if batch:
        commit(batch, punctuate=True)
    last = max((e.ts for e in arrivals), default=0)
    commit([Rec("loopwarden.ticks", 0, 0, None, encode_tick(Tick(now_ms=max(last, task.clock) + ADVANCE_MS)))])
    states = {k.decode(): v for k, v in store.items() if not is_meta(k)}
    return transitions, states


def replay(arrivals):
    r = Replay()
    transitions = []
    for event in arrivals:
        transitions += r.feed(event)
    last = max((e.ts for e in arrivals), default=0)
    transitions += r.advance_to(max(last, r.clock or 0) + ADVANCE_MS)
    return transitions, {run_id: encode_state(s) for run_id, s in r.states.items()}


def per_run(transitions) -> dict[str, list]:
    runs: dict[str, list] = defaultdict(list)
    for t in transitions:
        runs[t.run_id].append(t)
    return dict(runs)


@st.composite
def arrivals(draw):
    """A fleet whose events arrive late by random delays, some runs stamped very long ago."""
    events = draw(fleet())
    old_runs = {e.run_id for e in events if draw(st.integers(0, 3)) == 0}
    keyed = []
    for i, event in enumerate(events):
        delay = draw(st.sampled_from((0, 0, 0, 1_000, 60_000, 400_000, 2_000_000, 10**9)))
        arrival = event.ts + delay
        if event.run_id in old_runs:  # a producer's buffer flushed now, its events stamped at 0-80 ms
            event = msgspec.structs.replace(event, ts=draw(st.integers(0, 80)))
        keyed.append((arrival, i, event))
    keyed.sort(key=lambda k: k[:2])
    order = [e for _a, _i, e in keyed]
    cuts = set(draw(st.lists(st.integers(1, max(1, len(order))), max_size=len(order))))
    return order, cuts


@settings(max_examples=FLEETS, deadline=None, suppress_health_check=list(HealthCheck))
@given(arrivals())
def test_worker_and_replay_end_in_the_same_states_for_any_arrival_order(case) -> None:
    """Random fleets, late and very old events: the worker's stage (any batching) equals replay, run by run."""
    order, cuts = case
    w_transitions, w_states = worker(order, cuts)
    r_transitions, r_states = replay(order)
    assert per_run(w_transitions) == per_run(r_transitions)
    assert w_states == r_states


def _seed_then_old_runs():
    with open(SEED, "rb") as f:
        seed = [decode_input(line) for line in f if line.strip()]
    old = []
    for n, base in ((1, 0), (2, 40)):
        run = f"old-{n}"
        old += [
            decode_input(encode_line) for encode_line in (
                b'{"type":"run_started","run_id":"%s","ts":%d,"agent":"a","policy":{"version":"v1","stop_when":[]}}'
                % (run.encode(), base),
                b'{"type":"step_finished","run_id":"%s","ts":%d,"segment":0,"step":0,"finish_reason":"stop",'
                b'"tool_calls":[],"usage":{"input_tokens":1,"output_tokens":1}}' % (run.encode(), base + 10),
                b'{"type":"run_ended","run_id":"%s","ts":%d,"segment":0,"cause":"natural_finish","fired":[],'
                b'"step_count":1,"approval":null,"error_name":null}' % (run.encode(), base + 20),
                b'{"type":"outcome_receipt","run_id":"%s","ts":%d,"receipt_id":"r%d","kind":"file",'
                b'"verifier":"destination","verified":true,"evidence":{}}' % (run.encode(), base + 40, n),
            )
        ]
    return seed, old


def test_complete_runs_stamped_long_ago_arriving_after_a_fleet_are_complete_in_both_shells() -> None:
    """Two complete runs stamped ts 0-80, arriving after the seed fleet (stamped in 2026), end VERIFIED_COMPLETE everywhere."""
    seed, old = _seed_then_old_runs()
    order = seed + old
    expected = {"old-1": ("VERIFIED_COMPLETE", "receipt"), "old-2": ("VERIFIED_COMPLETE", "receipt")}
    r = Replay(keep_final=True)
    for event in order:
        r.feed(event)
    r.finish(advance_s=1800)
    assert {k: (t.to_state, t.reason) for k, t in r.final.items() if k.startswith("old-")} == expected
    assert [t.to_state for t in per_run(replay(order)[0])["old-1"]] == ["RUNNING", "VERIFYING", "VERIFIED_COMPLETE"]
    for cuts in (set(), set(range(len(order)))):  # one batch per topic run, or one event per batch
        transitions, _states = worker(order, cuts)
        runs = per_run(transitions)
        assert {k: (v[-1].to_state, v[-1].reason) for k, v in runs.items() if k.startswith("old-")} == expected
        assert runs["old-1"][0].seq == 1 and [t.seq for t in runs["old-1"]] == [1, 2, 3]
    # On the wall clock (a live worker, its wall clock where the fleet's clock is) the same verdicts.
    wall = max(e.ts for e in seed)
    transitions, _states = worker(order, set(range(len(order))), clock="wall", wall=lambda: wall)
    runs = per_run(transitions)
    assert {k: (v[-1].to_state, v[-1].reason) for k, v in runs.items() if k.startswith("old-")} == expected


def test_an_event_older_than_the_clock_counts_from_the_clock() -> None:
    """A late run's inactivity and receipt window start at the clock when it arrived, not at its old ts."""
    seed, old = _seed_then_old_runs()
    r = Replay(keep_final=True)
    for event in seed + old[:3]:  # the old run ended, its receipt not yet in
        r.feed(event)
    clock = r.clock
    state = r.states["old-1"]
    assert state.health == "VERIFYING"
    assert state.last_activity_ts == clock and state.verify_deadline_ts == clock + 600_000
    assert [t for t in r.advance_to(clock + 599_999) if t.run_id == "old-1"] == []
    assert [t.to_state for t in r.advance_to(clock + 600_000) if t.run_id == "old-1"] == ["FALSE_COMPLETE"]


def test_a_tie_in_ts_across_topics_is_applied_steps_first_however_the_batch_begins() -> None:
    """A run's run_ended and its receipt stamped in one millisecond: the worker applies the step first, whether
    the batch's first record is the receipt (the outcomes topic's record fetched first, or held from the last
    fold) or the step; so the run's path does not depend on how the fetches cut the batch, and is replay's
    of the step then the receipt (RUNNING > VERIFYING > VERIFIED_COMPLETE, not straight to VERIFIED_COMPLETE)."""
    t = 5_000_000
    events = [decode_input(msgspec.json.encode(e)) for e in (
        started(ts=t), step(0, ts=t + 10), ended("natural_finish", 1, ts=t + 20), receipt("rc1", ts=t + 20))]
    run_end, rcpt = events[2], events[3]
    expected = [x.to_state for x in replay(events)[0]]
    assert expected == ["RUNNING", "VERIFYING", "VERIFIED_COMPLETE"]

    def fold(order) -> list[str]:
        _store, task = _task()
        offsets: dict[str, int] = defaultdict(int)
        records = []
        for event in order:
            topic = _topic(event)
            records.append(Rec(topic, 0, offsets[topic], event.run_id.encode(), encode(event)))
            offsets[topic] += 1
        out = task.fold(records)
        assert not out.deadletters
        return [x.to_state for x in out.transitions]

    assert fold(events[:2] + [run_end, rcpt]) == expected
    assert fold(events[:2] + [rcpt, run_end]) == expected  # the receipt's topic first in the batch
    assert fold([rcpt] + events[:2] + [run_end]) == expected  # ... and first of all (merged by ts, then the tie)


def test_a_tie_across_batches_waits_for_the_lagging_steps_topic() -> None:
    """The receipt is fetched while agent.steps still lags, stamped at the steps' stream time (another run's step
    in the batch); its run's run_ended, in that same millisecond, comes in the next batch. The receipt waits
    (it could still be tied by a step), so the step goes first here too: the path is replay's."""
    t = 5_000_000
    mine = [decode_input(msgspec.json.encode(e)) for e in (
        started(ts=t), step(0, ts=t + 10), ended("natural_finish", 1, ts=t + 20), receipt("rc1", ts=t + 20))]
    other = decode_input(msgspec.json.encode(started(run="o", ts=t + 20)))
    store, task = _task()
    first = [Rec("agent.steps", 0, i, e.run_id.encode(), encode(e)) for i, e in enumerate((*mine[:2], other))]
    first.append(Rec("agent.outcomes", 0, 0, b"r", encode(mine[3])))
    out = task.fold(first, lagging={"steps"})
    assert task.holding == 1 and out.offsets == {"agent.steps": 3}  # the receipt waits; its offset is not passed
    store.write(out.changes, None)
    task.committed(out)
    later = task.fold([Rec("agent.steps", 0, 3, b"r", encode(mine[2]))])
    paths = [x.to_state for x in out.transitions + later.transitions if x.run_id == "r"]
    assert paths == [x.to_state for x in replay(mine)[0]] == ["RUNNING", "VERIFYING", "VERIFIED_COMPLETE"]
