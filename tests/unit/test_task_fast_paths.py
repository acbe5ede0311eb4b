"""The health stage's fold keeps two shortcuts of its own; each agrees with what it replaces.

* ``inputs.merge_by_ts``: the two inputs in event-time order, a copy of ``heapq.merge`` for two lists;
* ``inputs.decode_input`` and ``inputs.decode_records``: the unchecked decoder first, the checked one for anything
  it does not accept;
* the hot states (``stages/health/hotstates.py``): committed RunStates kept decoded between batches (``hot_runs``),
  taken out by a fold and put back on commit. A fold with them gives what a fold decoding every
  state from the store gives (``hot_runs=0``), batch by batch, through aborted transactions,
  restarts and stores written behind the task's back.
"""

from __future__ import annotations

import heapq
from collections import Counter, defaultdict

import msgspec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loopwarden.codecs import OutcomeExpected, OutcomeReceipt, encode
from loopwarden.rules import Settings, decode_state, encode_state
from loopwarden.engine.store import MemoryPartition
from loopwarden.stages.health.inputs import merge_by_ts as _merge
from loopwarden.stages.health.task import PartitionTask, Tick, encode_tick
from tests.strategies import fleet
from tests.builders import Rec

ROLES = {"agent.steps": "steps", "agent.outcomes": "outcomes", "loopwarden.ticks": "ticks"}


class _Ev(msgspec.Struct):
    ts: int


items = st.lists(st.integers(0, 6), max_size=12).map(lambda ts: [("r", _Ev(t), n) for n, t in enumerate(ts)])


@settings(max_examples=500, deadline=None)
@given(items, items, st.booleans())
def test_merge_equals_heapq_merge(first, second, sort) -> None:
    """_merge yields heapq.merge's order on sorted and unsorted inputs alike, ties to the first list."""
    if sort:
        first.sort(key=lambda i: i[1].ts)
        second.sort(key=lambda i: i[1].ts)
    second = [("o", ev, n) for _r, ev, n in second]
    assert _merge(first, second) == list(heapq.merge(first, second, key=lambda i: i[1].ts))


def _records(events) -> list[Rec]:
    offsets: dict[str, int] = defaultdict(int)
    out = []
    for ev in events:
        topic = "agent.outcomes" if isinstance(ev, (OutcomeReceipt, OutcomeExpected)) else "agent.steps"
        out.append(Rec(topic, 0, offsets[topic], ev.run_id.encode(), encode(ev)))
        offsets[topic] += 1
    return out


class _Worker:
    """A partition's task over a memory store, committed as the engine does (store write, then committed)."""

    def __init__(self, hot_runs: int) -> None:
        self.store = MemoryPartition()
        self.hot_runs = hot_runs
        self.task = self._new_task()

    def _new_task(self) -> PartitionTask:
        task = PartitionTask(0, self.store, ROLES, settings=Settings(), clock="event", wall_ms=lambda: 2**53 - 1,
                             max_future_ms=2**53, hot_runs=self.hot_runs)
        task.rebuild()
        return task

    def fold(self, records, commit: bool):
        out = self.task.fold(records, punctuate=True)
        seen = (list(out.transitions), dict(out.changes), Counter(out.counts), list(out.outputs))
        if commit:
            self.store.write(out.changes, None)
            self.task.committed(out)
        else:
            self.task.discard()
        return seen

    def restart(self) -> None:
        self.task = self._new_task()


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(fleet(), st.data(), st.sampled_from((1, 2, 3, 256)))
def test_hot_states_fold_as_states_decoded_from_the_store(events, data, hot_runs) -> None:
    """Batches with hot states equal batches decoding every state (hot_runs=0): aborts, restarts, outside writes."""
    records = _records(sorted(events, key=lambda e: e.ts))
    hot, cold = _Worker(hot_runs), _Worker(0)
    i = 0
    while i < len(records):
        size = data.draw(st.integers(1, 8))
        batch = records[i:i + size]
        what = data.draw(st.sampled_from(("commit", "commit", "commit", "abort", "restart", "rewrite")))
        if what == "abort":  # the transaction failed: the same records come again
            assert hot.fold(batch, commit=False) == cold.fold(batch, commit=False)
        elif what == "restart":
            hot.restart()
            cold.restart()
        elif what == "rewrite" and hot.store:  # the store changed under the task (a restore): the task sees it
            key = data.draw(st.sampled_from(sorted(k for k in hot.store if k[:1] != b"\xff")))
            state = decode_state(hot.store[key], key.decode())
            state.seq += 100  # as another worker's later commits would have left it
            for w in (hot, cold):
                w.store.write({key: encode_state(state)}, None)
        assert hot.fold(batch, commit=True) == cold.fold(batch, commit=True)
        for run_id, (raw, state) in hot.task.hot.entries.items():  # the invariant under test
            assert decode_state(raw, run_id) == state and state.run_id == run_id  # used only while the store holds raw
        assert len(hot.task.hot) <= hot_runs
        i += size
    tick = [Rec("loopwarden.ticks", 0, 0, None, encode_tick(Tick(now_ms=2**52)))]
    assert hot.fold(tick, commit=True) == cold.fold(tick, commit=True)
    assert dict(hot.store.items()) == dict(cold.store.items())


def test_events_are_counted_once_each_by_role_and_type() -> None:
    """A batch's ("event", role, type) counts are the events it applied, steps and receipts alike."""
    from tests.unit.test_task import LOG

    records = [r for r in LOG[0] if r.topic in ("agent.steps", "agent.outcomes")][:200]
    task = PartitionTask(0, MemoryPartition(), ROLES, settings=Settings(), clock="event",
                         wall_ms=lambda: 2**53 - 1, max_future_ms=2**53)
    out = task.fold(records)
    from loopwarden.codecs import decode_input

    expected = Counter()
    for r in records:
        try:
            ev = decode_input(r.value)
        except Exception:  # noqa: BLE001 - the fleet's bad messages are dead-lettered, not counted as events
            continue
        expected["event", ROLES[r.topic], ev.__struct_config__.tag] += 1
    assert {k: v for k, v in out.counts.items() if k[0] == "event"} == expected
    assert sum(expected.values()) + len(out.deadletters) == len(records)


def _decode_input_checked(rec, role, ts_limit, max_future_ms):
    """stages.health.inputs.decode_input without its fast path: every record the checked way (the reference)."""
    from loopwarden.codecs import InvalidEvent, decode_outcome_event, decode_step_event
    from loopwarden.engine.stage import DeadLetter, header

    try:
        decode = decode_step_event if role == "steps" else decode_outcome_event
        event = decode(rec.value if rec.value is not None else b"", header(rec.headers, "content-type"))
    except InvalidEvent as exc:
        return DeadLetter(rec, exc.reason, str(exc))
    if rec.key is None or rec.key != event.run_id.encode():
        shown = None if rec.key is None else rec.key[:80]
        return DeadLetter(
            rec, "key_mismatch",
            f"message key {shown!r} does not match run_id {event.run_id!r} (events must be keyed by run_id)")
    if event.ts > ts_limit:
        ahead_s = (event.ts - (ts_limit - max_future_ms)) / 1000
        return DeadLetter(rec, "ts_in_future", f"ts {event.ts} is {ahead_s:.0f} s ahead of this worker's wall clock "
                                               f"(at most max_future_skew_s={max_future_ms / 1000:g} s is accepted)")
    return role, event, rec


@st.composite
def _input_records(draw):
    from loopwarden.codecs import MSGPACK
    from loopwarden.codecs.wire import MAX_EVENT_BYTES
    from tests.strategies import any_event

    event = draw(any_event)
    ctype = draw(st.sampled_from((None, "application/json", MSGPACK, "text/plain", "APPLICATION/JSON")))
    value = encode(event, MSGPACK if ctype == MSGPACK else "application/json")
    value = draw(st.one_of(
        st.just(value), st.just(value[:-1]), st.just(value + b"x"), st.binary(max_size=40), st.none(),
        st.just(bytearray(value)), st.just(memoryview(value)), st.just(value + b" " * MAX_EVENT_BYTES)))
    headers = () if ctype is None and draw(st.booleans()) else (
        [("Content-Type" if draw(st.booleans()) else "content-type", ctype.encode())] if ctype else None)
    key = draw(st.sampled_from((event.run_id.encode(), None, b"other")))
    return Rec(draw(st.sampled_from(("agent.steps", "agent.outcomes"))), 0, 0, key, value, headers or ())


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_input_records(), st.sampled_from(("steps", "outcomes")), st.integers(0, 2**53))
def test_the_folds_input_decoding_equals_the_checked_decoding(rec, role, ts_limit) -> None:
    """inputs.decode_input (unchecked decoder first) gives the event or the dead letter the checked way gives."""
    from loopwarden.stages.health.inputs import decode_input

    assert decode_input(rec, role, ts_limit, 300_000) == _decode_input_checked(rec, role, ts_limit, 300_000)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.one_of(_input_records(), st.builds(
    Rec, st.sampled_from(("loopwarden.ticks", "other.topic")), st.just(0), st.integers(0, 9), st.none(),
    st.just(b"{}"), st.just(()))), max_size=30), st.integers(0, 2**53))
def test_a_batchs_input_decoding_equals_the_checked_decoding_record_by_record(records, ts_limit) -> None:
    """inputs.decode_records (decode_input's accepting path inline) gives, record by record and topic by topic, the
    event or the dead letter the checked way gives; ticks handed back, other topics dead-lettered."""
    from loopwarden.stages.health.batch import HealthFolded
    from loopwarden.stages.health.inputs import decode_records

    per_topic: dict = {}
    out = HealthFolded()
    ticks = decode_records(records, ROLES, ts_limit, 300_000, per_topic, out)
    expected: dict = {}
    for rec in records:
        role = ROLES.get(rec.topic)
        if role in ("steps", "outcomes"):
            expected.setdefault(rec.topic, []).append((rec, _decode_input_checked(rec, role, ts_limit, 300_000)))
    assert per_topic == expected
    assert ticks == [r for r in records if r.topic == "loopwarden.ticks"]
    assert [d.reason for d in out.deadletters] == ["wrong_topic" for r in records if r.topic == "other.topic"]


def _samples(metrics, names) -> dict:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in metrics.registry.collect() if family.name in names for s in family.samples}


def test_the_stages_transition_metrics_per_batch_equal_them_per_transition() -> None:
    """HealthStage.committed counts a batch's transitions per distinct pair: the same counters as one by one."""
    from loopwarden.rules import TIMER_REASONS
    from loopwarden.stages.health.batch import wall_clock_ms
    from loopwarden.stages.health.stage import HealthStage
    from loopwarden.engine.metrics import EngineMetrics
    from loopwarden.stages.health.metrics import AGENT_LABELS_MAX, HealthMetrics
    from tests.unit.test_task import LOG

    task = PartitionTask(0, MemoryPartition(), ROLES, settings=Settings(), clock="event",
                         wall_ms=lambda: 2**53 - 1, max_future_ms=2**53)
    batches = []
    for i in range(0, len(LOG[0]), 37):
        out = task.fold(LOG[0][i:i + 37], punctuate=True)
        task.store.write(out.changes, None)
        task.committed(out)
        batches.append(out)
    assert sum(len(b.transitions) for b in batches) > 50
    new, ref = HealthMetrics(EngineMetrics()), HealthMetrics(EngineMetrics())
    ref._agents.update(f"a{i}" for i in range(AGENT_LABELS_MAX - 2))  # noqa: SLF001 - near the label cap, in both
    new._agents.update(ref._agents)  # noqa: SLF001
    stage = HealthStage.__new__(HealthStage)
    stage.metrics = new
    for out in batches:
        stage.committed(0, task, out, Counter())
        now_ms = wall_clock_ms()  # the reference: the loop as it was, one transition at a time
        ref.count_batch(out.counts)
        for t in out.transitions:
            ref.child(ref.transitions, t.from_state or "none", t.to_state).inc()
            ref.child(ref.agent_transitions, ref.agent_label(t.agent), t.to_state).inc()
            (ref.timer_latency if t.reason in TIMER_REASONS else ref.latency).observe(max(0.0, (now_ms - t.ts) / 1000))
    names = {"loopwarden_transitions", "loopwarden_agent_transitions", "loopwarden_events",
             "loopwarden_event_to_transition_seconds", "loopwarden_timer_to_transition_seconds"}
    got, want = _samples(new, names), _samples(ref, names)
    assert {k for k in want if k[0].endswith("_total")} and got.keys() == want.keys()
    for key, value in want.items():
        if key[0].endswith(("_sum", "_created")):  # the wall clock moved between the two
            continue
        assert got[key] == value, key


@settings(max_examples=2000, deadline=None)
@given(st.binary(max_size=300) | st.text(max_size=60).map(str.encode))
def test_murmur2_equals_aiokafkas(data) -> None:
    """assignment.murmur2 (four bytes at a time) hashes every key as aiokafka's partitioner does."""
    from aiokafka.partitioner import murmur2 as reference

    from loopwarden.engine.assignment import murmur2, partition_of

    assert murmur2(data) == reference(data)
    assert partition_of(data, 8) == (reference(data) & 0x7FFFFFFF) % 8
