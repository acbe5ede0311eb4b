"""A partition's batch fold without Kafka: transactions are all or nothing, restarts lose nothing.

A dict stands in for a partition's store and a list of records for the consumed log. A
"transaction" here is what the loop commits: the batch's transitions, its changes written
to the store and its offsets, together, or none of them. A crash can be cut at any batch;
what a restarted worker sees is exactly what was committed.
"""

from __future__ import annotations

import json
import zlib
from collections import Counter, defaultdict

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loopwarden.codecs import decode_input
from loopwarden.replay import Replay
from loopwarden.rules import Settings
from loopwarden.simulate import fleet
from loopwarden.engine.store import MemoryPartition
from loopwarden.stages.health.task import CLOCK_KEY, PartitionTask, Tick, encode_tick, is_meta
from tests.builders import Rec

ROLES = {"agent.steps": "steps", "agent.outcomes": "outcomes", "loopwarden.ticks": "ticks"}
TOPICS = {"steps": "agent.steps", "outcomes": "agent.outcomes"}
PARTITIONS = 3
ADVANCE_MS = 3_600_000
MESSAGES = fleet(120, seed=11, bad_every=15)
LAST_TS = max(m.ts for m in MESSAGES)


def consumed_log(messages) -> dict[int, list[Rec]]:
    """Per partition, the records as a worker consumes them (offsets per topic partition)."""
    next_offset: dict[tuple[str, int], int] = defaultdict(int)
    out: dict[int, list[Rec]] = defaultdict(list)
    for m in messages:
        topic = TOPICS[m.topic]
        p = zlib.crc32(m.key or b"") % PARTITIONS
        out[p].append(Rec(topic, p, next_offset[topic, p], m.key, m.value))
        next_offset[topic, p] += 1
    return out


LOG = consumed_log(MESSAGES)


class Partition:
    """One partition's committed store and offsets, and what its transactions produced."""

    def __init__(self, p: int, store: MemoryPartition | None = None, offsets: dict | None = None) -> None:
        self.p = p
        self.store = store if store is not None else MemoryPartition()
        self.offsets = dict(offsets or {})
        self.task = PartitionTask(p, self.store, ROLES, settings=Settings(), clock="event")
        self.task.rebuild()
        self.transitions: list = []
        self.deadletters = 0
        self.ticks = 0

    def pending(self) -> list[Rec]:
        return [r for r in LOG[self.p] if r.offset >= self.offsets.get(r.topic, 0)]

    def batch(self, records: list[Rec], *, commit: bool = True, punctuate: bool = False) -> None:
        out = self.task.fold(records, punctuate=punctuate)
        if not commit:  # the transaction aborted (or the worker died before committing)
            self.task.discard()
            return
        self.transitions += out.transitions
        self.deadletters += len(out.deadletters)
        self.store.write(out.changes, None)
        self.offsets.update(out.offsets)
        self.task.committed(out)

    def tick(self, now_ms: int) -> None:
        self.ticks += 1
        self.batch([Rec("loopwarden.ticks", self.p, self.ticks, None, encode_tick(Tick(now_ms=now_ms)))])


def final(transitions) -> dict[str, str]:
    best: dict[str, tuple[int, str]] = {}
    for t in transitions:
        if t.run_id not in best or t.seq > best[t.run_id][0]:
            best[t.run_id] = (t.seq, t.to_state)
    return {r: v[1] for r, v in best.items()}


def run_all(batch_size: int) -> list[Partition]:
    parts = []
    for p in range(PARTITIONS):
        part = Partition(p)
        records = part.pending()
        for i in range(0, len(records), batch_size):
            part.batch(records[i:i + batch_size], punctuate=True)
        part.tick(LAST_TS + ADVANCE_MS)
        parts.append(part)
    return parts


def replay_final() -> dict[str, str]:
    replay = Replay(keep_final=True)
    for m in MESSAGES:
        if m.valid:
            replay.feed(decode_input(m.value))
    replay.advance_to(LAST_TS + ADVANCE_MS)
    return {r: t.to_state for r, t in replay.final.items()}


BASELINE = run_all(batch_size=7)
BASELINE_TRANSITIONS = [t for part in BASELINE for t in part.transitions]


def test_batched_folding_matches_replay_at_any_batch_size() -> None:
    """Final states equal replay's whether a batch holds 1, 7 or every record of a partition."""
    expected = replay_final()
    assert final(BASELINE_TRANSITIONS) == expected
    for size in (1, 10_000):
        assert final(t for part in run_all(size) for t in part.transitions) == expected
    assert sum(part.deadletters for part in BASELINE) == sum(not m.valid for m in MESSAGES) > 0


def test_one_change_per_run_touched_and_offsets_per_topic() -> None:
    """A batch writes each run it touched once (its last state), and the next offset of each topic."""
    part = Partition(0)
    records = part.pending()[:50]
    out = part.task.fold(records)
    touched = {r.key for r in records if r.key is not None}
    run_keys = {k for k in out.changes if not is_meta(k)}
    assert run_keys <= touched and len(run_keys) == len(out.changes) - (CLOCK_KEY in out.changes)
    last = {}
    for r in records:
        last[r.topic] = r.offset + 1
    assert out.offsets == last
    assert out.consumed == 50


def test_steps_and_receipts_are_applied_in_event_time_order() -> None:
    """Within a batch, a receipt stamped after a run_ended is applied after it, whatever the topics' order."""
    run = [m for m in MESSAGES if m.key == b"run-11-000000-natural_verified"]
    assert {m.topic for m in run} == {"steps", "outcomes"}
    receipts = [Rec(TOPICS[m.topic], 0, i, m.key, m.value) for i, m in enumerate(run) if m.topic == "outcomes"]
    steps = [Rec(TOPICS[m.topic], 0, i, m.key, m.value) for i, m in enumerate(run) if m.topic == "steps"]
    part = Partition(0)
    out = part.task.fold(receipts + steps)  # the outcomes topic's records first, as a fetch may return them
    assert [t.to_state for t in out.transitions] == ["RUNNING", "VERIFYING", "VERIFIED_COMPLETE"]


def test_the_event_clock_is_committed_with_the_batch() -> None:
    part = Partition(0)
    part.batch(part.pending()[:20])
    assert part.task.clock > 0 and CLOCK_KEY in part.store
    again = Partition(0, part.store, part.offsets)
    assert again.task.clock == part.task.clock


def _content(t) -> tuple:
    return (t.run_id, t.seq, t.from_state, t.to_state, t.reason, t.ts)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(partition=st.integers(0, PARTITIONS - 1), sizes=st.lists(st.integers(1, 40), min_size=1, max_size=20),
       crash_at=st.integers(0, 19), committed_crash=st.booleans())
def test_a_crash_at_any_batch_then_recovery_loses_and_repeats_nothing(partition, sizes, crash_at, committed_crash) -> None:
    """Batches commit all or nothing; a worker dies at any batch (before or after its commit); a new one
    recovers the committed store and offsets and goes on. What both committed is exactly what one
    uninterrupted worker commits over the same committed batches: every (run_id, seq) once, same content."""
    first = Partition(partition)
    records = first.pending()
    committed_chunks, i = [], 0
    for n, size in enumerate(sizes):
        chunk = records[i:i + size]
        if n == crash_at:
            first.batch(chunk, commit=committed_crash, punctuate=True)
            if committed_crash:
                committed_chunks.append(chunk)
            break
        first.batch(chunk, punctuate=True)
        committed_chunks.append(chunk)
        i += size
    second = Partition(partition, first.store, first.offsets)  # recovery: the committed store and offsets
    rest = second.pending()
    rest_chunks = [rest[j:j + 13] for j in range(0, len(rest), 13)]
    for chunk in rest_chunks:
        second.batch(chunk, punctuate=True)
    second.tick(LAST_TS + ADVANCE_MS)

    reference = Partition(partition)
    for chunk in committed_chunks + rest_chunks:
        reference.batch(chunk, punctuate=True)
    reference.tick(LAST_TS + ADVANCE_MS)

    both = [_content(t) for t in first.transitions + second.transitions]
    assert len({c[:2] for c in both}) == len(both)  # each (run_id, seq) exactly once
    assert both == [_content(t) for t in reference.transitions]
    assert final(first.transitions + second.transitions) == final(
        t for t in BASELINE_TRANSITIONS if zlib.crc32(t.run_id.encode()) % PARTITIONS == partition)


def test_a_deeply_nested_message_is_dead_lettered_as_too_deep_and_the_batch_goes_on() -> None:
    """100,000 nested arrays (JSON, unknown field; and a tick) are dead letters with their own reason."""
    part = Partition(0)
    good = part.pending()[:10]
    deep = b'{"type":"step_finished","run_id":"r","x":' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    bad = [Rec("agent.steps", 0, 10_000, b"r", deep), Rec("loopwarden.ticks", 0, 0, None, b"[" * 100_000)]
    out = part.task.fold(good[:5] + bad + good[5:])
    assert [(d.reason, d.record.topic) for d in out.deadletters] == [("too_deep", "agent.steps"),
                                                                   ("undecodable", "loopwarden.ticks")]
    assert out.counts["invalid", "steps", "too_deep"] == 1
    assert sum(n for k, n in out.counts.items() if k[0] == "event") == 10


def test_a_dropped_run_leaves_a_tomb_in_the_changelog_and_its_seq_goes_on_after_a_restart() -> None:
    """Retention writes the run's tomb (not a delete); a restarted worker continues the run id's seq from it."""
    from loopwarden.codecs import encode
    from loopwarden.rules import decode_state
    from tests.builders import ended, started, step, timed

    def recs(events, first_offset):
        return [Rec("agent.steps", 0, first_offset + i, b"r", encode(decode_input(json.dumps(e).encode())))
                for i, e in enumerate(events)]

    settings = Settings(retention_s=60, seq_memory_s=3600)
    store = MemoryPartition()
    task = PartitionTask(0, store, ROLES, settings=settings, clock="event")
    task.rebuild()
    run = timed(started(), step(0), ended("natural_finish", 1))
    out = task.fold(recs(run, 0))
    assert [t.seq for t in out.transitions] == [1, 2]
    store.write(out.changes, None)
    task.committed(out)
    late = run[-1]["ts"] + 600_000 + 61_000  # past the receipt window (FALSE_COMPLETE) and retention
    for now in (run[-1]["ts"] + 600_001, late):
        out = task.fold([Rec("loopwarden.ticks", 0, now, None, encode_tick(Tick(now_ms=now)))])
        store.write(out.changes, None)
        task.committed(out)
    tomb = decode_state(store[b"r"], "r")
    assert tomb.tomb and tomb.seq == 3  # RUNNING, VERIFYING, FALSE_COMPLETE
    again = PartitionTask(0, store, ROLES, settings=settings, clock="event")  # a restart: state from the store
    again.rebuild()
    out = again.fold(recs(timed(started(), step(0), start=late + 1000), 10))
    assert [(t.seq, t.from_state, t.to_state) for t in out.transitions] == [(4, None, "RUNNING")]


def test_an_event_or_tick_from_the_far_future_is_dead_lettered_and_moves_no_clock() -> None:
    """ts = 2^53 - 1 once moved a partition's event clock to the end of time: every running run went STUCK.
    (Ticks are not bounded: moving the clock is what they are for; who may write them is an ACL matter.)"""
    from loopwarden.codecs import encode

    wall = LAST_TS + 1000
    task = PartitionTask(0, MemoryPartition(), ROLES, settings=Settings(), clock="event", wall_ms=lambda: wall,
                         max_future_ms=300_000)
    task.rebuild()
    good = LOG[0][:40]
    out = task.fold(good)
    clock = task.clock
    running = task.state_counts["RUNNING"] + sum(1 for t in out.transitions if t.to_state == "RUNNING")
    assert running > 0
    task.committed(out)
    poison = decode_input(LOG[0][0].value)
    far = encode(type(poison)(**{**{f: getattr(poison, f) for f in poison.__struct_fields__}, "ts": 2**53 - 1}))
    near = encode(type(poison)(**{**{f: getattr(poison, f) for f in poison.__struct_fields__}, "ts": wall + 299_000}))
    receipt_rec = next(r for r in LOG[0] if r.topic == "agent.outcomes")
    receipt_ev = decode_input(receipt_rec.value)
    far_receipt = encode(type(receipt_ev)(**{**{f: getattr(receipt_ev, f) for f in receipt_ev.__struct_fields__},
                                              "ts": 2**53 - 1}))
    bad = [Rec("agent.steps", 0, 9_000, LOG[0][0].key, far), Rec("agent.outcomes", 0, 9_000, receipt_rec.key, far_receipt)]
    out = task.fold(bad + [Rec("agent.steps", 0, 9_001, LOG[0][0].key, near)])
    assert [(d.reason, d.record.topic) for d in out.deadletters] == [("ts_in_future", "agent.steps"),
                                                                   ("ts_in_future", "agent.outcomes")]
    assert "ahead of this worker's wall clock" in out.deadletters[0].error
    assert clock <= task.clock <= wall + 299_000  # the 299 s one is within the bound; nothing went further
    assert not [t for t in out.transitions if t.to_state == "STUCK"]


def test_runs_index_walks_every_held_run_once_in_run_id_order_and_skips_tombs() -> None:
    """The read API's index, fed by the committed batches: pages of any size after a run id cover
    each held run once (what the store holds), a state filter keeps only that state, a run dropped
    to a tomb leaves it, and an index rebuilt from the store equals the one fed batch by batch."""
    from loopwarden.rules import decode_state, encode_state
    from loopwarden.api import pages

    part = run_all(batch_size=50)[0]
    store = part.store
    live = [decode_state(store[k], k.decode()) for k in store if not is_meta(k)]
    held = {s.run_id: s.health for s in live if not s.tomb and s.health is not None}
    assert len(held) > 20
    fed = part.task.index
    for size in (1, 7, 1000):
        seen, cursor = [], None
        while True:
            page, cursor = pages.page({0: fed}, state=None, agent=None, order="id", cursor=cursor,
                                          limit=size, now_ms=LAST_TS)
            assert len(page) <= size
            seen += page
            if cursor is None:
                break
        assert [r["run_id"] for r in seen] == sorted(held)
        assert {r["run_id"]: r["state"] for r in seen} == held
    state = next(iter(held.values()))
    page, _ = pages.page({0: fed}, state=state, agent=None, order="id", cursor=None, limit=1000, now_ms=LAST_TS)
    assert [r["run_id"] for r in page] == sorted(r for r, s in held.items() if s == state)
    assert len(fed) == len(held)
    fed_entries = {order: list(fed.walk(None, order, None)) for order in ("id", "age")}
    part.task.rebuild()  # as after a restore: from the store alone
    index = part.task.index
    assert len(index) == len(held)
    assert {order: list(index.walk(None, order, None)) for order in ("id", "age")} == fed_entries
    # retention drops a run to a tomb: committed, it leaves the index
    gone = sorted(held)[0]
    tomb = {gone.encode(): encode_state(decode_state(store[gone.encode()], gone).__class__(run_id=gone, seq=3, tomb=True))}
    store.write(tomb, None)
    index.committed(tomb)
    assert index.get(gone) is None and len(index) == len(held) - 1


def _paths(transitions) -> dict[str, list[str]]:
    paths: dict[str, list[tuple[int, str]]] = defaultdict(list)
    for t in transitions:
        paths[t.run_id].append((t.seq, t.to_state))
    return {r: [s for _, s in sorted(v)] for r, v in paths.items()}


def _outcomes_first(p: int, chunk: int, align: bool) -> Partition:
    """Partition ``p`` consumed as when the outcomes topic is fetched far ahead of the steps topic:
    every receipt in the first batch, the steps ``chunk`` at a time; the steps input is lagging
    until its last chunk."""
    part = Partition(p)
    steps = [r for r in LOG[p] if r.topic == TOPICS["steps"]]
    pending = [r for r in LOG[p] if r.topic == TOPICS["outcomes"]]
    i = 0
    while i < len(steps) or pending or part.task.holding:
        fresh, i = steps[i:i + chunk], i + chunk
        lagging = {"steps"} if align and i < len(steps) else set()
        out = part.task.fold(pending + fresh, lagging=lagging)
        pending = []
        part.transitions += out.transitions
        part.deadletters += len(out.deadletters)
        part.store.write(out.changes, None)
        part.offsets.update(out.offsets)
        part.task.committed(out)
    part.tick(LAST_TS + ADVANCE_MS)
    return part


def test_receipts_consumed_ahead_of_a_lagging_steps_topic_wait_for_their_run() -> None:
    """Stream-time alignment: with the outcomes topic consumed far ahead, every run takes replay's path
    (not only its final state); folding what comes as it comes does not."""
    replay = Replay()
    out = []
    for m in MESSAGES:
        if m.valid:
            out += replay.feed(decode_input(m.value))
    out += replay.advance_to(LAST_TS + ADVANCE_MS)
    want = _paths(out)
    aligned = [t for p in range(PARTITIONS) for t in _outcomes_first(p, 9, align=True).transitions]
    assert _paths(aligned) == want
    unaligned = [t for p in range(PARTITIONS) for t in _outcomes_first(p, 9, align=False).transitions]
    assert final(unaligned) == final(aligned)
    differ = [r for r, path in _paths(unaligned).items() if path != want[r]]
    assert differ  # e.g. RUNNING > VERIFIED_COMPLETE where replay passes through VERIFYING


def test_a_held_record_holds_the_rest_of_its_topic_and_its_offset() -> None:
    """What is held is a tail of its topic in offset order (dead letters in it too): the offsets stop
    before it and nothing of it is applied or dead-lettered yet."""
    run = [m for m in MESSAGES if m.key == b"run-11-000000-natural_verified"]
    steps = [Rec(TOPICS["steps"], 0, i, m.key, m.value) for i, m in enumerate(r for r in run if r.topic == "steps")]
    receipt = next(m for m in run if m.topic == "outcomes")
    outcomes = [Rec(TOPICS["outcomes"], 0, 0, receipt.key, receipt.value),
                Rec(TOPICS["outcomes"], 0, 1, receipt.key, b"not json")]
    part = Partition(0)
    first = part.task.fold(outcomes + steps[:-1], lagging={"steps"})  # the run_ended is not consumed yet
    assert part.task.holding == 2
    assert part.task.held_bytes == len(receipt.value) + len(b"not json")  # what input_buffer_max_bytes counts
    assert first.offsets == {TOPICS["steps"]: len(steps) - 1} and not first.deadletters
    assert [t.to_state for t in first.transitions] == ["RUNNING"]
    part.store.write(first.changes, None)
    part.task.committed(first)
    second = part.task.fold(steps[-1:])  # held records first, then these
    assert [t.to_state for t in second.transitions] == ["VERIFYING", "VERIFIED_COMPLETE"]
    assert second.offsets == {TOPICS["outcomes"]: 2, TOPICS["steps"]: len(steps)}
    assert len(second.deadletters) == 1 and part.task.holding == 0 and part.task.held_bytes == 0


def test_a_failed_transaction_forgets_what_was_held() -> None:
    """discard(): the batch is consumed again from the committed offsets, which stop before held records."""
    run = [m for m in MESSAGES if m.key == b"run-11-000000-natural_verified"]
    receipt = next(m for m in run if m.topic == "outcomes")
    part = Partition(0)
    part.task.fold([Rec(TOPICS["outcomes"], 0, 0, receipt.key, receipt.value)], lagging={"steps"})
    assert part.task.holding == 1 and part.task.held_bytes == len(receipt.value)
    part.task.discard()
    assert part.task.holding == 0 and part.task.held_bytes == 0


def test_the_worker_folds_what_producers_must_also_tell_as_replay_does() -> None:
    """segment_started, run_active and events_dropped fold through the worker's store as in replay."""
    import msgspec

    from tests.builders import active, approval, dropped, ended, resolved, segment_started, started, step

    t0 = 1_000_000
    events = [
        started(run="lossy", ts=t0), step(0, ("lookup", "result"), run="lossy", ts=t0 + 1000),
        dropped(5, run="lossy", ts=t0 + 2000),
        started(run="slow", ts=t0), step(0, ("lookup", "result"), run="slow", ts=t0 + 1000),
        *[active(run="slow", ts=t0 + 1000 + k * 100_000) for k in (1, 2, 3)],
        step(1, run="slow", ts=t0 + 401_000), ended("natural_finish", 2, run="slow", ts=t0 + 401_500),
        started(run="resumed", ts=t0), step(0, ("pay", "approval_requested"), run="resumed", ts=t0 + 1000),
        ended("approval_required", 1, run="resumed", ts=t0 + 1500, approval=approval()),
        resolved(run="resumed", ts=t0 + 2000),
        segment_started(1, [{"kind": "step_count", "count": 1}], run="resumed", ts=t0 + 2500),
        step(0, ("lookup", "result"), run="resumed", seg=1, ts=t0 + 3000),
        ended("stop_condition", 1, "step_count:1", run="resumed", seg=1, ts=t0 + 3500),
    ]
    events.sort(key=lambda e: e["ts"])
    records = [Rec("agent.steps", 0, i, e["run_id"].encode(), msgspec.json.encode(e)) for i, e in enumerate(events)]
    part = Partition(0)
    for rec in records:
        part.batch([rec], punctuate=True)
    part.tick(t0 + ADVANCE_MS)
    replay = Replay(keep_final=True)
    expected = [t for e in events for t in replay.feed(decode_input(msgspec.json.encode(e)))]
    expected += replay.advance_to(t0 + ADVANCE_MS)
    assert sorted(map(_content, part.transitions)) == sorted(map(_content, expected))
    got = final(part.transitions)
    assert got == {r: t.to_state for r, t in replay.final.items()}
    assert got == {"lossy": "UNCERTAIN", "slow": "FALSE_COMPLETE", "resumed": "BOUNDED_STOP"}  # slow: no receipt
    assert "STUCK" not in {t.to_state for t in part.transitions if t.run_id == "slow"}
    lossy = [t for t in part.transitions if t.run_id == "lossy"][-1]
    assert (lossy.reason, lossy.evidence.events_dropped) == ("producer_dropped", 5)


def test_the_committed_state_counts_follow_the_store_after_timers_fire() -> None:
    """state_counts (the runs gauge) equals the health of the states in the store, timer firings included."""
    from loopwarden.rules import decode_state

    for part in run_all(batch_size=7):
        held = Counter(decode_state(v, k.decode()).health for k, v in part.store.items() if not is_meta(k))
        counted = Counter({k: n for k, n in part.task.state_counts.items() if n})
        assert counted == held


def test_the_store_and_the_timer_queue_share_each_runs_key_object() -> None:
    """A run's store key and its timer queue entry are one bytes object (no second object per run), batch
    after batch and after a rebuild from the store; the read index holds the same objects."""
    for part in run_all(batch_size=50)[:2]:
        task = part.task
        for _ in range(2):
            keys = [key for key, _ in part.store.items() if not is_meta(key)]
            held = [task.timers.held(key) for key in keys]
            assert len(keys) > 20 and all(h is not None for h in held)
            assert all(h is key for h, key in zip(held, keys))
            assert {id(k) for k in task.index.pending if not is_meta(k)} <= {id(k) for k in keys}  # none of its own
            assert len(task.index) == sum(1 for k in keys if task.index.get(k.decode()) is not None)
            task.rebuild()  # as after a restore: the queue is built from the store's own keys


def test_a_rebuild_in_steps_yields_to_the_loop_and_ends_as_one_rebuild_does() -> None:
    """``rebuild_steps`` reads the store a step of runs at a time (the engine's owning serves the other partitions
    between steps, ``manager.rebuilt``) and leaves the task as ``rebuild`` does: counts, clock and due timers."""
    import asyncio

    from loopwarden.engine.manager import rebuilt

    part = Partition(0)
    for i in range(0, len(LOG[0]), 50):
        part.batch(LOG[0][i:i + 50])
    runs = sum(part.task.state_counts.values())
    assert runs > 10
    stepped = PartitionTask(0, part.store, ROLES, settings=Settings(), clock="event")
    assert list(stepped.rebuild_steps(step=4)) == [4] * (runs // 4) + [runs % 4]
    whole = PartitionTask(0, part.store, ROLES, settings=Settings(), clock="event")
    assert whole.rebuild() == runs
    assert stepped.state_counts == whole.state_counts == part.task.state_counts and stepped.clock == whole.clock
    turns = []

    async def count_turns() -> None:
        while True:
            turns.append(1)
            await asyncio.sleep(0)

    async def scenario() -> None:
        ticker = asyncio.create_task(count_turns())
        task = PartitionTask(0, part.store, ROLES, settings=Settings(), clock="event")
        task.rebuild_steps = lambda: task.__class__.rebuild_steps(task, step=2)  # type: ignore[method-assign]
        await rebuilt(task)
        ticker.cancel()
        assert task.state_counts == whole.state_counts

    asyncio.run(scenario())
    assert len(turns) >= runs // 2  # the loop ran between the steps
    far = LAST_TS + 30 * 86_400_000  # past every timer: retention included
    due = [t.fold([Rec("loopwarden.ticks", 0, 0, None, encode_tick(Tick(now_ms=far)))]) for t in (stepped, whole)]
    fired = [(sorted((x.run_id, x.to_state) for x in d.transitions), sorted(d.changes.items())) for d in due]
    assert fired[0][1] and fired[0] == fired[1]
