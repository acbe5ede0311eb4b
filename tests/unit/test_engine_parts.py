"""The engine's small parts without Kafka: output routing, dead letters as outputs, the stage defaults."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from loopwarden.engine.assignment import partition_of
from loopwarden.engine.outputs import OVERHEAD, Router, deadletter_output
from loopwarden.engine.stage import DeadLetter, Output, StageBase
from tests.builders import Rec as _Rec


def test_an_output_without_a_partition_goes_where_the_default_partitioner_puts_its_key() -> None:
    """murmur2 over the output topic's own partition count; keyed-like-input topics of the inputs' count keep p."""
    router = Router(input_partitions=8, keyed_like_input=frozenset({"agent.health"}))
    router.counts = {"agent.health": 8, "agent.steps": 3, "other": 8}
    for key in (b"run-1", b"trace-\xff", b"x" * 300):
        assert router.partition("agent.steps", key, 5) == partition_of(key, 3)
        assert router.partition("other", key, 5) == partition_of(key, 8)  # not declared keyed like the input
        assert router.partition("agent.health", key, 5) == 5
    router.counts["agent.health"] = 4  # a different count: the partitioner decides
    assert router.partition("agent.health", b"run-1", 5) == partition_of(b"run-1", 4)
    assert router.partition("agent.steps", None, 7) == 7 % 3


def test_a_dead_letter_is_the_original_with_headers_naming_why_and_cut_to_fit() -> None:
    """Key, value and headers kept; error headers added; a message too large is cut and says so."""
    rec = _Rec("agent.steps", 2, 41, b"run-9", b'{"bad":1}', (("content-type", b"application/json"),))
    out = deadletter_output(DeadLetter(rec, "undecodable", "no type"), "dead", 6, 1_000_000)
    assert isinstance(out, Output) and out.topic == "dead" and out.partition == partition_of(b"run-9", 6)
    assert out.key == b"run-9" and out.value == b'{"bad":1}'
    headers = dict(out.headers)
    assert headers["error_reason"] == b"undecodable" and headers["source_offset"] == b"41"
    big = _Rec("agent.steps", 3, 1, None, b"v" * 50_000)
    cut = deadletter_output(DeadLetter(big, "too_large", "big"), "dead", 6, 20_000)
    assert len(cut.value) <= 20_000 - OVERHEAD and dict(cut.headers)["truncated"] == b"50000"
    assert cut.partition == 3  # no key: its own partition number


def test_a_stage_needs_to_declare_only_its_topics_and_task() -> None:
    """StageBase's observers do nothing and its summary is empty: a stage overrides what it needs."""
    base = StageBase()
    assert base.summary([]) == "" and base.keyed_like_input == frozenset() and base.punctuate_every_s == 1.0


class _Batch:
    """aiokafka's BatchBuilder (its size limit decides when it is full), with the keys it took."""

    def __init__(self, real) -> None:
        self.real, self.keys = real, []

    def append(self, *, key, value, timestamp, headers):
        meta = self.real.append(key=key, value=value, timestamp=timestamp, headers=headers)
        if meta is not None:
            self.keys.append(key)
        return meta

    def record_count(self) -> int:
        return self.real.record_count()


class _Sends:
    """What a producer was handed, in order: real aiokafka batches (``create_batch``), sends recorded."""

    def __init__(self, max_batch_size: int) -> None:
        from aiokafka import AIOKafkaProducer

        self._real = AIOKafkaProducer(bootstrap_servers="127.0.0.1:1", max_batch_size=max_batch_size)
        self.sent: list[tuple[str, int, list[bytes]]] = []  # (topic, partition, keys) per send, in order

    def create_batch(self) -> _Batch:
        return _Batch(self._real.create_batch())

    async def send_batch(self, batch: _Batch, topic: str, *, partition: int):
        self.sent.append((topic, partition, batch.keys))
        return _done(batch.keys)

    async def send(self, topic: str, value, *, key, partition: int, headers):
        self.sent.append((topic, partition, [key]))
        return _done([key])

    async def partitions_for(self, topic: str) -> set[int]:
        return set(range(8))  # every partition these tests send to exists

    async def close(self) -> None:
        await self._real.stop()


def _done(value):
    import asyncio

    future = asyncio.get_running_loop().create_future()
    future.set_result(value)
    return future


def test_the_outbox_keeps_each_partitions_records_in_order_across_full_batches_and_an_oversize_record() -> None:
    """Records past a full batch, and one larger than any batch, reach the producer in the order they were added."""
    import asyncio

    from loopwarden.engine.checkpoint import _Outbox

    async def go() -> list:
        producer = _Sends(max_batch_size=2048)
        outbox = _Outbox(producer)  # type: ignore[arg-type]
        added: dict[tuple[str, int], list[bytes]] = {}
        for i in range(60):
            tp = ("changelog", 3) if i % 3 else ("health", 1)
            key = b"k%03d" % i
            value = b"v" * (5000 if i == 31 else 100)  # record 31 fits no batch
            added.setdefault(tp, []).append(key)
            if not outbox.put(*tp, key, value, (("h", b"1"),) if i == 7 else ()):
                await outbox.spill(*tp, key, value)
        await outbox.flush()
        await producer.close()
        return [producer.sent, added]

    sent, added = asyncio.run(go())
    assert len(sent) > 4  # several full batches per partition, and the oversize record on its own
    got: dict[tuple[str, int], list[bytes]] = {}
    for topic, partition, keys in sent:
        got.setdefault((topic, partition), []).extend(keys)
    assert got == added


def test_each_partition_punctuates_once_per_interval_at_its_own_phase() -> None:
    """At once the first time, then once a second each, the i-th of 8 at i/8 s into the second: spread, not all at once."""
    from loopwarden.engine.partition import OwnedPartition

    parts = [OwnedPartition(p, None, None, None, None, None) for p in range(8)]  # type: ignore[arg-type]
    fired: dict[int, list[float]] = {p: [] for p in range(8)}
    for ms in range(0, 5000, 3):  # the loop's turns, every 3 ms
        now = 100.0 + ms / 1000
        for i, part in enumerate(parts):
            part.punctuate_if_due(now, 1.0, i / 8)
            if part.punctuate:
                fired[i].append(now)
                part.take()
    for i, times in fired.items():
        assert times[0] == 100.0 and 5 <= len(times) <= 6
        gaps = [b - a for a, b in zip(times[1:], times[2:])]
        assert all(abs(g - 1.0) < 0.004 for g in gaps), (i, gaps)
        assert abs((times[1] - i / 8) % 1.0) < 0.004 or abs((times[1] - i / 8) % 1.0 - 1.0) < 0.004
    seconds = sorted(round((times[2] % 1.0) * 8) % 8 for times in fired.values())
    assert seconds == list(range(8))  # one partition per eighth of the second


@dataclass
class _Record:
    topic: str
    offset: int
    value: bytes | None = b"{}"


def test_an_owned_partition_takes_each_offset_once_from_where_it_resumed() -> None:
    """Records below the offset it resumed at, or handed a second time, are not buffered; later ones are, in order."""
    from loopwarden.engine.partition import OwnedPartition

    part = OwnedPartition(0, None, None, None, None, None)  # type: ignore[arg-type]
    part.next_offsets = {"in": 350}
    part.accept("in", [_Record("in", o) for o in range(235, 400)])  # fetched from the group's offset, behind
    part.accept("in", [_Record("in", o) for o in range(350, 420)])  # the same again after a rewind, and more
    part.accept("in", [_Record("in", o) for o in (425, 426)])  # a gap (transaction markers take offsets)
    assert part.buffered_topics == {"in"}
    assert [r.offset for r in part.take()[0]] == [*range(350, 420), 425, 426]
    assert part.next_offsets == {"in": 427} and part.buffered_topics == set()  # what came after a take: none yet


def test_a_batch_got_across_an_owning_is_not_taken_and_its_inputs_are_fetched_again() -> None:
    """A batch ``getmany`` returned while partitions were owned (sought) anew goes to no partition: each owned
    input in it is sought back to the offset its partition takes next (unowned ones are left); a later one is taken."""
    from aiokafka import TopicPartition

    from loopwarden.config import Config
    from loopwarden.engine.loop import Engine
    from loopwarden.engine.partition import AssignedPartition, OwnedPartition
    from tests.engine.counter_stage import CounterStage

    class Consumer:
        def __init__(self) -> None:
            self.sought: list[tuple[TopicPartition, int]] = []

        def seek(self, tp: TopicPartition, offset: int) -> None:
            self.sought.append((tp, offset))

    engine = Engine(Config(partitions=2), CounterStage("in", "out", "app"))
    engine.consumer = engine.partitions.consumer = consumer = Consumer()  # type: ignore[assignment]
    owned = OwnedPartition(0, engine.stage, None, None, None, None)  # type: ignore[arg-type]
    owned.next_offsets = {"in": 350}
    engine.assigned[0], engine.assigned[1] = AssignedPartition(0), AssignedPartition(1)
    engine.assigned[0].owned = owned
    batch = {TopicPartition("in", 0): [_Record("in", o) for o in range(235, 535)],
             TopicPartition("in", 1): [_Record("in", o) for o in range(10, 20)]}
    engine.partitions.hand_out(batch, engine.partitions.seeks - 1)  # asked for before the last owning
    assert consumer.sought == [(TopicPartition("in", 0), 350)]
    assert owned.buffered == []
    engine.partitions.hand_out({TopicPartition("in", 0): [_Record("in", o) for o in range(350, 650)]}, engine.partitions.seeks)
    assert [r.offset for r in owned.buffered] == list(range(350, 650))


def test_a_transaction_of_an_ownership_already_dropped_leaves_the_current_one_alone() -> None:
    """A pipeline still committing when its partition was dropped and owned again must not drop the new
    ownership when its transaction then fails or is fenced (the fence would keep the partition idle for two
    session timeouts); the same failure of the current ownership drops it."""
    import asyncio

    from loopwarden.config import Config
    from loopwarden.stages.health.stage import HealthStage
    from loopwarden.engine.manager import PartitionManager
    from loopwarden.engine.metrics import EngineMetrics
    from loopwarden.engine.partition import AssignedPartition
    from loopwarden.stages.health.metrics import HealthMetrics

    class Part:  # what the manager reads of an OwnedPartition (its number, its identity) and its close()
        def __init__(self, number: int) -> None:
            self.number, self.closed = number, False

        async def close(self, stopping=None) -> None:
            self.closed = True

    metrics = EngineMetrics()
    manager = PartitionManager(Config(), HealthStage(Config(), HealthMetrics(metrics)), metrics, Router(8))
    old, new = Part(3), Part(3)
    a = manager.assigned[3] = AssignedPartition(3)
    a.owned = new  # type: ignore[assignment]
    asyncio.run(manager.fenced(old))  # type: ignore[arg-type]
    asyncio.run(manager.failed(old, OSError("gone")))  # type: ignore[arg-type]
    assert a.owned is new and not new.closed and a.recover_at is None
    asyncio.run(manager.fenced(new))  # type: ignore[arg-type]
    assert a.owned is None and new.closed and a.recover_at is not None


def test_the_watch_shows_the_lag_of_every_turn_and_drops_a_forgotten_partitions_series() -> None:
    """Each turn measures the lag afresh (a scrape right after the last commit reads 0), writing the gauge only
    when it changed; a partition no longer assigned loses its series, and gets it back when assigned again."""
    from loopwarden.engine.metrics import EngineMetrics
    from loopwarden.engine.partition import AssignedPartition
    from loopwarden.engine.watch import Watch

    class Ends:  # the one consumer call the watch makes
        def __init__(self) -> None:
            self.end = 5

        def highwater(self, tp) -> int:
            return self.end

    ends, metrics = Ends(), EngineMetrics()
    watch = Watch(ends, {"agent.steps": "steps"}, metrics, stall_timeout_s=60, malloc_trim_s=0)
    a = AssignedPartition(2)
    a.committed["agent.steps"] = 0

    def lag():
        return metrics.registry.get_sample_value("loopwarden_consumer_lag", {"topic": "steps", "partition": "2"})

    watch.check({2: a})
    assert lag() == 5
    ends.end = 9
    watch.check({2: a})
    assert lag() == 9
    a.committed["agent.steps"] = 9
    watch.check({2: a})
    assert lag() == 0
    watch.forget(2)
    assert lag() is None
    watch.check({2: a})
    assert lag() == 0


def test_the_outbox_hands_back_each_batchs_ack_in_order_and_on_an_error_raises_it_and_reads_the_others() -> None:
    """delivered(): (topic, records, metadata) per batch sent, in order; a failed batch's error is raised, and a
    second failed batch's error is read too, so asyncio logs no "exception was never retrieved"."""
    import asyncio
    import gc
    import logging

    from loopwarden.engine.checkpoint import _Outbox

    async def go() -> tuple:
        loop = asyncio.get_running_loop()
        ok = _Outbox(None)  # type: ignore[arg-type]
        late = loop.create_future()
        ok.sent = [("health", 3, loop.create_future()), ("changelog", 2, late)]
        ok.sent[0][2].set_result("meta-h")
        loop.call_later(0.01, late.set_result, "meta-c")
        metas = await ok.delivered()
        bad = _Outbox(None)  # type: ignore[arg-type]
        first, second = loop.create_future(), loop.create_future()
        bad.sent = [("health", 1, first), ("changelog", 1, second)]
        loop.call_later(0.01, first.set_exception, RuntimeError("first batch failed"))
        loop.call_later(0.02, second.set_exception, RuntimeError("second batch failed"))
        try:
            await bad.delivered()
        except RuntimeError as exc:
            raised = str(exc)
        await asyncio.sleep(0.05)  # the second fails after the first was raised
        return metas, raised

    logged: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: logged.append(record.getMessage())  # type: ignore[method-assign]
    logging.getLogger("asyncio").addHandler(handler)
    try:
        metas, raised = asyncio.run(go())
        gc.collect()  # a future never retrieved logs when it is freed
    finally:
        logging.getLogger("asyncio").removeHandler(handler)
    assert metas == [("health", 3, "meta-h"), ("changelog", 2, "meta-c")]
    assert raised == "first batch failed"
    assert not [m for m in logged if "never retrieved" in m], logged


class _FencedAfterFirstSend(_Sends):
    """aiokafka's order when the sender finds a fence: the first batch's future fails and the transaction ends in
    one callback; the caller holds a shield of that future, which fails a turn of the loop later, and may send
    again first (a metadata reply can wake it in the same turn)."""

    def __init__(self) -> None:
        super().__init__(max_batch_size=2048)
        self.inner: list = []

    async def send_batch(self, batch: _Batch, topic: str, *, partition: int):
        import asyncio

        from aiokafka.errors import IllegalOperation, ProducerFenced

        if self.inner:  # the sender failed the first batch and left the transaction: all in one turn
            self.inner[0].set_exception(ProducerFenced())
            raise IllegalOperation("Can't send messages while not in transaction")
        self.inner.append(asyncio.get_running_loop().create_future())
        return asyncio.shield(self.inner[0])


def test_a_fence_found_between_two_sends_is_raised_as_the_fence_though_the_first_batch_fails_a_turn_later() -> None:
    import asyncio

    from aiokafka.errors import ProducerFenced

    from loopwarden.engine.checkpoint import _Outbox

    async def go() -> BaseException | None:
        producer = _FencedAfterFirstSend()
        outbox = _Outbox(producer)  # type: ignore[arg-type]
        outbox.put("health", 0, b"run-1", b"{}")
        await outbox.flush()
        outbox.put("changelog", 0, b"run-1", b"state")
        try:
            await outbox.flush()
            return None
        except BaseException as exc:  # noqa: BLE001 - what it raised is the finding
            return exc
        finally:
            await producer.close()

    raised = asyncio.run(go())
    assert type(raised) is ProducerFenced, repr(raised)


class _Producer:
    """begin_transaction as aiokafka's: a coroutine that waits turns of the loop; counted, as is stop."""

    def __init__(self) -> None:
        self.begun = self.stopped = 0

    async def begin_transaction(self) -> None:
        import asyncio

        await asyncio.sleep(0)
        await asyncio.sleep(0)
        self.begun += 1

    async def stop(self) -> None:
        self.stopped += 1


class _Quiet:
    def dropped(self, partition, task) -> None: ...

    def close(self) -> None: ...


def test_a_partition_begins_its_next_transaction_once_and_a_drop_cancels_a_begin_under_way() -> None:
    """begin_next() starts begin_transaction at once; take_begun() hands it over once; close() cancels one not
    done (its producer stops) and leaves none behind."""
    import asyncio

    from loopwarden.engine.partition import OwnedPartition, Stopping

    async def go() -> tuple:
        producer = _Producer()
        part = OwnedPartition(0, _Quiet(), None, _Quiet(), producer, None)  # type: ignore[arg-type]
        assert part.take_begun() is None  # a partition just owned: its first commit begins its own
        part.begin_next()
        begun = part.take_begun()
        assert part.take_begun() is None
        await begun  # type: ignore[misc]
        done = producer.begun
        part.begin_next()
        pending = part.begun
        await part.close(Stopping())
        await asyncio.sleep(0.01)
        return done, pending, part.begun, producer

    done, pending, left, producer = asyncio.run(go())
    assert done == 1 and pending.cancelled() and left is None
    assert producer.begun == 1 and producer.stopped == 1


def test_the_idle_clock_of_alignment_runs_until_the_input_waited_for_sends_a_backlog() -> None:
    """``max.task.idle.ms``: records held while the lagging input drains a backlog (records written more than
    ``align_max_ms`` ago, in as many small batches as it takes) wait as long as that takes; held with nothing
    from it, or with only fresh records of a live input, for ``align_max_ms``, or ``HOLD_MAX`` of them, they
    are folded without waiting. (Counted from when holding began, a backlog slower than 1 s to drain would fold
    its receipts before their runs' steps.)"""
    from collections import namedtuple

    from loopwarden.engine.alignment import HOLD_MAX, Alignment

    rec = namedtuple("rec", "topic timestamp")
    wall = 1_700_000_000_000
    old, fresh = rec("agent.steps", wall - 60_000), rec("agent.steps", wall - 200)
    a = Alignment(None, 0, {"agent.steps": "steps", "agent.outcomes": "outcomes", "ticks": "ticks"}, 1000)

    def fold(holding, records, at, waited=("steps",)):
        a.folded(holding, records, {r.topic for r in records}, set(waited), now=at, wall_ms=wall)

    fold(3, [rec("agent.outcomes", wall - 60_000)], 100.0)  # receipts held for the steps topic
    assert not a.overdue(100.9) and a.overdue(101.0)
    for t in range(1, 10):  # the steps topic draining its backlog, a batch every 0.5 s, receipts still held
        fold(3, [old, rec("ticks", wall)], 100.0 + t / 2)
        assert not a.overdue(100.0 + t / 2 + 0.9)
    fold(3, [rec("agent.outcomes", wall - 60_000), rec("ticks", wall)], 106.0)  # no steps: the clock runs on
    assert not a.overdue(105.4) and a.overdue(105.5)
    fold(3, [fresh], 107.0)  # steps live, not a backlog: the clock runs on too
    assert a.overdue(105.5)
    fold(3, [old], 108.0, waited=())  # steps of a topic not waited for (overdue, or caught up): runs on
    assert a.overdue(105.5)
    fold(0, [old], 109.0)  # nothing held: nothing waits
    assert a.idle_since is None and not a.overdue(1e9)
    fold(HOLD_MAX, [old], 110.0)  # held the most it may: fold them now
    assert a.overdue(110.0) and a.wait_for({"steps"}, a.overdue(110.0)) == set()
    a.forget()
    assert not a.overdue(1e9)
    assert Alignment(None, 0, {"agent.steps": "steps"}, 0).wait_for({"steps"}, False) == set()  # 0: no waiting


def _limits_reading_everything(seen_ts: dict, roles: dict, per_topic: dict, lagging) -> dict:
    """StreamTime.limits without ``shown``: every item of every topic read at every fold (the reference)."""
    from loopwarden.engine.alignment import ALIGNED

    stream_ts = dict(seen_ts)
    for topic, items in per_topic.items():
        role = roles[topic]
        high = stream_ts.get(role, -1)
        for _rec, item in items:
            if item.__class__ is tuple and item[1].ts > high:
                high = item[1].ts
        if high >= 0:
            stream_ts[role] = high
    limits = {}
    for i, role in enumerate(ALIGNED):
        others = [stream_ts.get(o, -1) - (j < i) for j, o in enumerate(ALIGNED) if o != role and o in lagging]
        if others:
            limits[role] = min(others)
    return limits


def test_stream_time_reads_held_records_once_and_gives_the_limits_of_reading_them_all() -> None:
    """Generated folds (records of three aligned inputs and dead letters, random lagging inputs, failed
    transactions): the limits read from ``shown`` and the new records only are those of reading every held
    record again, and no record past its limit is applied."""
    import random
    from collections import namedtuple

    from loopwarden.engine.alignment import ALIGNED, StreamTime
    from loopwarden.stages.health.batch import HealthFolded
    from loopwarden.engine.stage import DeadLetter

    ev, rec = namedtuple("ev", "ts"), namedtuple("rec", "topic offset value")
    roles = {"s": "steps", "o": "outcomes", "v": "verified_outcomes"}
    for seed in range(200):
        rng = random.Random(seed)
        stream = StreamTime(roles, ALIGNED)
        offsets = dict.fromkeys(roles, 0)
        clock = dict.fromkeys(roles, 1_000)
        for _fold in range(rng.randint(1, 25)):
            if rng.random() < 0.08:
                stream.discard()
                continue
            per_topic = stream.take_held()
            for topic in rng.sample(list(roles), rng.randint(0, 3)):
                items = per_topic.setdefault(topic, [])
                for _ in range(rng.randint(0, 6)):
                    clock[topic] += rng.randint(-30, 120)
                    r = rec(topic, offsets[topic], None if rng.random() < 0.05 else b"v" * rng.randint(0, 300))
                    offsets[topic] += 1
                    decoded = DeadLetter(r, "undecodable", "x") if rng.random() < 0.1 else (roles[topic], ev(clock[topic]), r)
                    items.append((r, decoded))
            lagging = set(rng.sample(list(ALIGNED), rng.randint(0, 3)))
            want = _limits_reading_everything(stream.seen_ts, roles, per_topic, lagging)
            assert stream.limits(per_topic, lagging) == want, (seed, _fold)
            for role, items in stream.ready(per_topic, lagging, HealthFolded()).items():  # none past its limit applied
                assert all(item[1].ts <= want[role] for item in items) if role in want else True
            held = [r for items in stream.held.values() for r, _ in items]  # what input_buffer_max_bytes counts
            assert stream.held_bytes == sum(len(r.value) for r in held if r.value is not None), (seed, _fold)


def test_a_producer_slow_to_stop_is_left_stopping_in_the_background_never_cut_off() -> None:
    """close() waits ``wait_s`` for the producer's stop, then returns with the stop still running, referenced and
    counted on the gauge until it ends. (A stop cancelled half-way leaves aiokafka's producer counted as closed
    while its sender goes on asking for a deleted output's metadata, so that a broker with
    auto.create.topics.enable creates it again at once, under `topics repair`.)"""
    import asyncio

    from prometheus_client import CollectorRegistry, Gauge

    from loopwarden.engine.partition import OwnedPartition, Stopping

    class Slow(_Producer):
        def __init__(self) -> None:
            super().__init__()
            self.release = asyncio.Event()
            self.cancelled = False

        async def stop(self) -> None:
            try:
                await self.release.wait()  # sends waiting for a partition that is gone, until it is back
            except asyncio.CancelledError:
                self.cancelled = True
                raise
            self.stopped += 1

    registry = CollectorRegistry()
    gauge = Gauge("stopping", "test", registry=registry)

    async def go() -> tuple:
        producer = Slow()
        stopping = Stopping(gauge)
        part = OwnedPartition(0, _Quiet(), None, _Quiet(), producer, None)  # type: ignore[arg-type]
        await part.close(stopping, wait_s=0.05)
        left = (len(stopping.stops), registry.get_sample_value("stopping"), producer.stopped)
        producer.release.set()
        for _ in range(5):
            await asyncio.sleep(0)
        return left, (len(stopping.stops), registry.get_sample_value("stopping"), producer.stopped, producer.cancelled)

    left, after = asyncio.run(go())
    assert left == (1, 1.0, 0)  # close() returned; the stop goes on, held and counted
    assert after == (0, 0.0, 1, False)  # it ended by itself, never cancelled


def test_an_owned_partition_counts_the_bytes_it_buffers_until_a_fold_takes_them() -> None:
    """``buffered_bytes``: the values' bytes of the records buffered (a tombstone's 0, records not taken not
    counted); a fold's take() and a drop leave none."""
    import asyncio

    from loopwarden.engine.partition import OwnedPartition, Stopping

    class Producer:
        async def stop(self) -> None: ...

    part = OwnedPartition(0, _Quiet(), None, _Quiet(), Producer(), None)  # type: ignore[arg-type]
    part.next_offsets = {"in": 2}
    part.accept("in", [_Record("in", o, b"x" * 100) for o in range(0, 4)])  # 0 and 1: behind, not taken
    part.accept("in", [_Record("in", 4, None), _Record("in", 5, b"y" * 7)])
    assert part.buffered_bytes == 2 * 100 + 0 + 7
    records, _, _ = part.take()
    assert len(records) == 4 and part.buffered_bytes == 0
    part.accept("in", [_Record("in", 6, b"z" * 50)])
    assert part.buffered_bytes == 50
    asyncio.run(part.close(Stopping()))
    assert part.buffered_bytes == 0 and part.buffered == []


def test_the_input_bound_sums_what_waits_and_unholds_only_tasks_that_hold() -> None:
    """InputBound: buffered and held bytes over every partition against ``input_buffer_max_bytes``; when held
    records fill it with nothing running and no input can be paused (tests/unit/test_pauses.py: when one can),
    the tasks holding records (only those) fold them as they are."""
    from prometheus_client import CollectorRegistry

    from loopwarden.engine.alignment import Alignment
    from loopwarden.engine.inputbound import InputBound
    from loopwarden.engine.metrics import EngineMetrics

    class Task:
        def __init__(self, holding: int, held_bytes: int) -> None:
            self.holding, self.held_bytes, self.held_topics = holding, held_bytes, ("in",) if holding else ()

    class Part:
        def __init__(self, number: int, buffered_bytes: int, holding: int, held_bytes: int) -> None:
            self.number, self.buffered_bytes, self.task = number, buffered_bytes, Task(holding, held_bytes)
            self.alignment = Alignment(None, number, {}, 1000)  # type: ignore[arg-type]

    metrics = EngineMetrics(CollectorRegistry())
    bound = InputBound(1000, metrics, "health")
    parts = [Part(0, 300, 0, 0), Part(1, 0, 2, 600), Part(2, 99, 0, 0)]
    assert bound.waiting(parts) == 999 and not bound.full(parts)
    assert metrics.registry.get_sample_value("loopwarden_input_waiting_bytes", {"stage": "health"}) == 999
    parts[2].buffered_bytes = 100
    assert bound.full(parts)
    assert bound.waiting([Part(0, 10, 0, 0)]) == 10  # the gauge follows; its peak stays at the most seen
    assert metrics.registry.get_sample_value("loopwarden_input_waiting_bytes", {"stage": "health"}) == 10
    assert metrics.registry.get_sample_value("loopwarden_input_waiting_peak_bytes", {"stage": "health"}) == 1000
    bound.waited()
    assert bound.unhold(parts)
    assert [p.alignment.overdue() for p in parts] == [False, True, False]  # only the one holding records
    assert not bound.unhold([Part(0, 5000, 0, 0)])  # nothing held: nothing to give up
    sample = metrics.registry.get_sample_value
    assert sample("loopwarden_input_buffer_full_total", {"stage": "health", "then": "unaligned"}) == 1
    assert sample("loopwarden_input_buffer_full_total", {"stage": "health", "then": "waited"}) == 1


def test_owning_again_runs_beside_the_loop_once_a_partition_and_lets_go_when_given_up() -> None:
    """A due partition gets one retry task (not two), its restore runs without the engine's lock and only the
    install takes it; a rebalance cancelling it mid-restore, or the partition given up while it waited for the
    lock, leaves nothing installed and what it held let go; a Kafka error backs off; a bug of ours surfaces in
    the loop's next turn."""
    import asyncio
    import time

    from aiokafka.errors import KafkaConnectionError

    from loopwarden.config import Config
    from loopwarden.engine.partition import AssignedPartition
    from loopwarden.engine.reowning import Reowning

    class Restorer:
        def __init__(self, config) -> None:
            self.stopped = False

        async def start(self) -> None:
            pass

        async def stop(self) -> None:
            self.stopped = True

    class Owning:
        def __init__(self) -> None:
            self.discarded = False

        async def discard(self) -> None:
            self.discarded = True

    class Manager:
        def __init__(self, engine) -> None:
            self.engine, self.assigned, self.installed, self.owning = engine, {}, [], []
            self.gate = asyncio.Event()  # prepare's restore ends when set
            self.error: BaseException | None = None

        async def prepare(self, partitions, restorer):
            assert not self.engine.lock.locked()  # beside the loop
            await self.gate.wait()
            if self.error is not None:
                raise self.error
            self.owning.append(Owning())
            return self.owning[-1]

        async def install(self, owning, reader) -> None:
            assert self.engine.lock.locked()
            self.installed.append(owning)
            self.assigned[0].owned, self.assigned[0].recover_at = object(), None

    class Engine:
        def __init__(self) -> None:
            self.config, self.lock, self.stopping = Config(), asyncio.Lock(), asyncio.Event()
            self.partitions = Manager(self)

        @property
        def assigned(self):
            return self.partitions.assigned

    async def scenario() -> None:
        engine = Engine()
        reowning = Reowning(engine.config, engine.partitions, engine.lock, engine.stopping,  # type: ignore[arg-type]
                            restorer=Restorer)
        a = engine.assigned[0] = AssignedPartition(0)
        engine.assigned[1] = AssignedPartition(1)  # owned or not due: left alone
        a.recover_at = time.monotonic()
        reowning.start_due()
        reowning.start_due()
        assert list(reowning.tasks) == [0] and a.recover_at is None
        await asyncio.sleep(0)
        # A rebalance cancels it mid-restore: nothing installed, nothing started again.
        await reowning.cancel()
        assert engine.partitions.installed == [] and a.owned is None
        # Given up while it waited for the lock: what it restored is let go, not installed.
        a.recover_at = time.monotonic()
        reowning.start_due()
        await asyncio.sleep(0)  # restoring
        async with engine.lock:
            engine.partitions.gate.set()
            for _ in range(5):
                await asyncio.sleep(0)
            engine.assigned[0] = AssignedPartition(0)  # the group assigned it afresh meanwhile
        await asyncio.gather(*reowning.tasks.values())
        assert engine.partitions.installed == [] and engine.partitions.owning[-1].discarded
        # Owned again: installed under the lock.
        a = engine.assigned[0]
        a.recover_at = time.monotonic()
        reowning.start_due()
        await asyncio.gather(*reowning.tasks.values())
        assert engine.partitions.installed == [engine.partitions.owning[-1]] and a.owned is not None
        assert not engine.partitions.owning[-1].discarded
        # A Kafka error backs off; a bug of ours is raised in the loop's next turn.
        a.owned, a.recover_at = None, time.monotonic()
        engine.partitions.error = KafkaConnectionError("gone")
        reowning.start_due()
        await asyncio.gather(*reowning.tasks.values())
        assert a.owned is None and a.recover_at is not None and a.recover_at > time.monotonic()
        a.recover_at, engine.partitions.error = time.monotonic(), ValueError("a bug")
        reowning.start_due()  # reaps the failed retry, starts the buggy one
        await asyncio.gather(*reowning.tasks.values(), return_exceptions=True)
        with pytest.raises(ValueError, match="a bug"):
            reowning.start_due()

    asyncio.run(scenario())
