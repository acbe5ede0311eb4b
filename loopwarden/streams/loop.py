"""The worker: one explicit consume → fold → produce loop on aiokafka, exactly-once by transactions.

Top to bottom, :meth:`Worker.run`:

1. ``getmany`` a batch (at most ``batch_max_records``, waiting at most ``batch_wait_ms``);
2. per owned partition, :meth:`PartitionTask.fold` the batch in the pure core (steps
   and receipts merged in event-time order; due timers fired once per tick interval);
3. per partition, one Kafka transaction with that partition's producer: the batch's
   transitions, dead letters, one changelog record per run touched, and the consumed
   offsets (``send_offsets_to_transaction``); the partitions' transactions run
   concurrently;
4. after a commit, the partition's store takes the batch's states (the store holds
   committed state only) and the metrics take the batch's counts.

**Fencing.** Each input partition *i* has its own transactional id,
``<app id>-<i>`` (the scheme of Kafka Streams' first exactly-once version and of
Faust): a worker that is assigned partition *i* starts a producer with that id, which
fences every earlier producer of it and waits until their open transaction is
committed or aborted. A worker that lost partition *i* (paused past its session, then
resumed) can never commit output, state or offsets for it again. aiokafka's
``send_offsets_to_transaction`` takes a group id only, not the consumer's group
metadata, so the KIP-447 scheme (one producer per worker, fenced by generation) is not
available; hence one producer per partition.

**Recovery** of an assigned partition: start its producer (fences, completes what a
previous owner left open), read its changelog partition ``read_committed`` into the
store, rebuild the timer queue, seek each input partition to the group's committed
offset. Nothing else: the committed offsets and the changelog were written in the
same transactions. A transaction that fails recovers its partition the same way
(its batch is consumed again); one that is fenced drops the partition until the
group assigns it again.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import signal
import threading
import time
from collections import Counter

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRebalanceListener, TopicPartition
from aiokafka.errors import KafkaError, ProducerFenced

from loopwarden import gctune
from loopwarden.codecs import encode
from loopwarden.rules import TIMER_REASONS, Settings
from loopwarden.streams import memory
from loopwarden.streams.assignment import CoPartitionedAssignor, partition_of
from loopwarden.streams.config import Config
from loopwarden.streams.logs import quiet_repeats
from loopwarden.streams.metrics import Metrics
from loopwarden.streams.security import client_options
from loopwarden.streams.store import PartitionStore, open_partition
from loopwarden.streams import readmodel
from loopwarden.streams.task import Batch, DeadLetter, PartitionTask, header, wall_clock_ms
from loopwarden.streams.topics import ensure_topics

log = logging.getLogger("loopwarden.worker")

EXIT_STOP_TIMEOUT = 3  # the worker was told to stop and had to be cut short
# Headers a dead letter adds; the original value is cut so the whole message fits.
_DEADLETTER_OVERHEAD = 4096


class _Rebalance(ConsumerRebalanceListener):
    def __init__(self, worker: "Worker") -> None:
        self.worker = worker

    async def on_partitions_revoked(self, revoked) -> None:
        await self.worker.release()

    async def on_partitions_assigned(self, assigned) -> None:
        await self.worker.assign({tp.partition for tp in assigned})


class Worker:
    """One loopwarden worker: the loop, its partitions' tasks, stores and producers, and the read model."""

    def __init__(self, config: Config, metrics: Metrics | None = None, verifiers=None) -> None:
        self.config = config
        self.metrics = metrics or Metrics()
        self.settings = Settings(retention_s=config.retention_s, seq_memory_s=config.seq_memory_s)
        # loopwarden.trust.TrustedVerifiers (spec.md section 10: LOOPWARDEN_TRUSTED_VERIFIERS); None: every receipt counts
        self.verifiers = verifiers
        self.roles = {config.steps_topic: "steps", config.outcomes_topic: "outcomes", config.ticks_topic: "ticks"}
        self.inputs = (config.steps_topic, config.outcomes_topic, config.ticks_topic)
        self.assignor = CoPartitionedAssignor(config.advertised_url)
        self.tasks: dict[int, PartitionTask] = {}
        self.stores: dict[int, PartitionStore] = {}
        self.producers: dict[int, AIOKafkaProducer] = {}
        self.assigned: set[int] = set()  # the group's assignment (a fenced partition is assigned but not owned)
        self.committed: dict[TopicPartition, int] = {}  # next offset per input partition, as committed
        self.progress_at: dict[int, float] = {}  # monotonic time a partition last committed progress
        self.stalled: set[int] = set()
        self.recover_at: dict[int, float] = {}  # assigned partitions not owned: when to try again
        self.ready = False
        self.lock = asyncio.Lock()  # a batch, or a rebalance step: never both
        self.stopping = asyncio.Event()
        self.consumer: AIOKafkaConsumer | None = None
        self.restorer: AIOKafkaConsumer | None = None
        self._last_punctuate = 0.0
        self._trimmed_at = time.monotonic()
        self.inflight: dict[int, asyncio.Task] = {}  # partition -> its pipeline (fold, then commit, while records wait)
        self.buffered: dict[int, list] = {}  # partition -> records consumed, not folded yet
        # partition -> since when its task holds records back for the other input to catch up
        # (PartitionTask.fold's ``lagging``): folded anyway after align_max_ms
        self.held_since: dict[int, float] = {}
        self.punctuate_pending: set[int] = set()  # partitions whose next fold fires due timers
        self.committed_at: dict[int, float] = {}  # partition -> monotonic time of its last commit
        self.health_partitions = config.partitions
        self.deadletter_partitions = config.partitions

    # -- read model (loopwarden.streams.http) ---------------------------------------------
    def owned(self) -> list[int]:
        return sorted(self.tasks)

    def partition_of(self, run_id: str) -> int:
        return partition_of(run_id.encode(), self.config.partitions)

    def owner_url(self, partition: int) -> str | None:
        return self.assignor.owners.get(partition)

    def run_state(self, run_id: str):
        """The run's committed state, if this worker owns its partition and holds it."""
        task = self.tasks.get(self.partition_of(run_id))
        state = None if task is None else task.committed_state(run_id)
        return None if state is None or state.tomb else state  # a tomb is a dropped run: not held

    def is_ready(self) -> bool:
        """The assignment is recovered and no partition is stalled."""
        return self.ready and not self.stalled

    def runs_page(self, **query) -> tuple[list[dict], tuple | None]:
        """A page of the runs this worker holds (see :func:`loopwarden.streams.readmodel.page`)."""
        return readmodel.page({p: task.index for p, task in self.tasks.items()}, **query)

    # -- lifecycle ----------------------------------------------------------------------
    async def run(self) -> None:
        """Create topics, join the group, process batches until :meth:`stop`."""
        c = self.config
        await ensure_topics(c)
        self.restorer = AIOKafkaConsumer(**client_options(c), group_id=None, enable_auto_commit=False,
                                         isolation_level="read_committed", auto_offset_reset="earliest")
        await self.restorer.start()
        self.consumer = AIOKafkaConsumer(
            **client_options(c), group_id=c.app_id, enable_auto_commit=False,
            auto_offset_reset="earliest", isolation_level="read_committed",
            partition_assignment_strategy=(self.assignor,),
            session_timeout_ms=int(c.session_timeout_s * 1000),
            heartbeat_interval_ms=max(100, int(c.session_timeout_s * 1000 / 6)),
            max_partition_fetch_bytes=max(1_048_576, c.max_message_bytes + 65536),
            fetch_max_bytes=64 * 1_048_576,
            fetch_max_wait_ms=50,
        )
        self.consumer.subscribe(list(self.inputs), listener=_Rebalance(self))
        await self.consumer.start()
        try:
            while not self.stopping.is_set():
                batch = await self.consumer.getmany(timeout_ms=c.batch_wait_ms or 1,
                                                     max_records=c.batch_max_records)
                async with self.lock:
                    await self.process(batch)
                await self.watch()
        finally:
            await self.shutdown()

    def stop(self) -> None:
        self.stopping.set()

    async def shutdown(self) -> None:
        """Finish the transactions in flight, stop the producers, leave the group (its partitions move at once).

        With the broker gone any step can fail: each is tried, none stops the others
        (the watchdog in :func:`run_worker` bounds the whole)."""
        async with self.lock:
            self.ready = False
            self._forget_buffered()
            await _quietly(self.drain(), "finishing the transactions in flight")
            for p in set(self.producers) | set(self.tasks) | set(self.stores):
                await _quietly(self._drop(p), f"stopping partition {p}")
        for client in (self.consumer, self.restorer):
            if client is not None:
                await _quietly(client.stop(), "stopping a consumer")

    # -- rebalance ------------------------------------------------------------------------
    async def release(self) -> None:
        """Partitions are about to be reassigned: stop working on any of them (after the batch in flight)."""
        async with self.lock:
            self.ready = False
            self._forget_buffered()  # consumed again from the committed offsets by whoever owns them next
            await self.drain()
            self.assigned = set()
            self.recover_at.clear()
            self.committed.clear()
            self.progress_at.clear()
            self.stalled.clear()
            for p in set(self.tasks) | set(self.producers) | set(self.stores):
                await self._drop(p)

    async def assign(self, partitions: set[int]) -> None:
        async with self.lock:
            self.assigned = set(partitions)
            t0 = time.monotonic()
            try:
                await self._recover(sorted(partitions))
            except (KafkaError, OSError, asyncio.TimeoutError) as exc:
                log.error("recovering partitions %s failed (%s: %s); retrying", sorted(partitions),
                          type(exc).__name__, exc)
                for p in partitions:
                    await self._drop(p)
                    self.recover_at[p] = time.monotonic() + 1.0
            gc.collect()
            gc.freeze()  # restored states are long-lived: keep them out of every collection
            self.ready = True
            runs = sum(sum(task.state_counts.values()) for task in self.tasks.values())
            log.info("partitions %s recovered in %.2fs (%d runs held)", sorted(self.tasks), time.monotonic() - t0, runs)

    async def _recover(self, partitions: list[int]) -> None:
        """Own ``partitions``: fence earlier producers, restore their changelog, resume at the committed offsets."""
        if not partitions:
            return
        c = self.config
        producers = {p: AIOKafkaProducer(
            **client_options(c), transactional_id=f"{c.app_id}-{p}", enable_idempotence=True,
            acks="all", max_request_size=c.max_message_bytes + _DEADLETTER_OVERHEAD * 2, linger_ms=0,
            max_batch_size=256 * 1024, request_timeout_ms=30_000,
            # A transaction begun right after the last one commits meets CONCURRENT_TRANSACTIONS
            # while the markers are written: retry that in ms, not the default 100 ms.
            retry_backoff_ms=10,
        ) for p in partitions}
        self.producers.update(producers)
        # InitProducerId: fences earlier owners and completes their open transaction, so the
        # changelog and the committed offsets read below are final.
        await asyncio.gather(*(producer.start() for producer in producers.values()))
        some = next(iter(producers.values()))
        self.health_partitions = len(await some.partitions_for(c.health_topic))
        self.deadletter_partitions = len(await some.partitions_for(c.deadletter_topic))
        for p in partitions:
            if p not in self.stores:
                self.stores[p] = open_partition(c.store, c.data_dir, c.app_id, p)
        await self._restore({p: self.stores[p] for p in partitions})
        assert self.consumer is not None
        tps = [TopicPartition(topic, p) for p in partitions for topic in self.inputs]
        committed = {tp: await self.consumer.committed(tp) for tp in tps}
        starts = await self.consumer.beginning_offsets([tp for tp, o in committed.items() if o is None]) \
            if None in committed.values() else {}
        for tp in tps:
            offset = committed[tp] if committed[tp] is not None else starts[tp]
            self.consumer.seek(tp, offset)
            self.committed[tp] = offset
        self.consumer.resume(*tps)
        for p in partitions:
            task = PartitionTask(p, self.stores[p], self.roles, settings=self.settings, clock=c.clock,
                                 max_future_ms=int(c.max_future_skew_s * 1000), verifiers=self.verifiers)
            task.rebuild()
            self._count_runs(task.state_counts)
            # Progress is committed offsets moving: a partition that fails and recovers again and
            # again makes none, and shows as stalled.
            self.progress_at.setdefault(p, time.monotonic())
            self.recover_at.pop(p, None)
            self.tasks[p] = task

    async def _restore(self, stores: dict[int, PartitionStore]) -> None:
        """Read the changelog partitions (committed records only) from each store's position to the end."""
        assert self.restorer is not None
        restorer = self.restorer
        tps = {TopicPartition(self.config.changelog_topic, p): store for p, store in stores.items()}
        restorer.assign(list(tps))
        ends = await restorer.end_offsets(list(tps))
        starts = await restorer.beginning_offsets(list(tps))
        todo = {}
        for tp, store in tps.items():
            if store.position > ends[tp]:
                log.warning("%s: local store at changelog offset %d but the changelog ends at %d "
                            "(topics recreated?): wiping the local state", tp, store.position, ends[tp])
                store.wipe()
            position = max(store.position, starts[tp])
            if position < ends[tp]:
                restorer.seek(tp, position)
                todo[tp] = position
            else:
                restorer.pause(tp)
        n = 0
        while todo:
            batch = await restorer.getmany(*todo, timeout_ms=1000, max_records=20_000)
            for tp, records in batch.items():
                if records:
                    tps[tp].write({r.key: r.value for r in records}, records[-1].offset + 1)
                    n += len(records)
            for tp in list(todo):
                position = await restorer.position(tp)
                if position >= ends[tp]:
                    tps[tp].write({}, position)
                    restorer.pause(tp)
                    del todo[tp]
        restorer.assign([])
        self.metrics.restored.inc(n)
        if n:
            log.info("restored %d changelog records for partitions %s", n, sorted(stores))

    async def _drop(self, p: int) -> None:
        """Stop working on ``p``: its producer stops; the memory store is dropped, RocksDB closed (kept on disk)."""
        self._forget_buffered(p)
        task = self.tasks.pop(p, None)
        if task is not None:
            self._count_runs(Counter({k: -v for k, v in task.state_counts.items()}))
        producer = self.producers.pop(p, None)
        if producer is not None:
            try:
                await asyncio.wait_for(producer.stop(), timeout=5)
            except Exception:  # a fenced or disconnected producer: nothing of it is needed any more
                log.debug("stopping the producer of partition %d failed", p, exc_info=True)
        store = self.stores.pop(p, None)
        if store is not None:
            store.close()
        for topic in self.inputs:
            tp = TopicPartition(topic, p)
            if p in self.assigned and self.consumer is not None:
                self.consumer.pause(tp)  # nothing of it is fetched until it is recovered
            elif topic != self.config.ticks_topic:
                try:
                    self.metrics.lag.remove(self.roles[topic], str(p))
                except KeyError:
                    pass

    def _count_runs(self, delta: Counter) -> None:
        m = self.metrics
        for state, n in delta.items():
            if state is not None and n:
                m.child(m.runs, state).inc(n)

    # -- the batch -----------------------------------------------------------------------
    async def process(self, batch: dict) -> None:
        """Hand each owned partition its records; start its pipeline unless one is running.

        A partition's pipeline folds what is buffered, commits it, and folds again
        while records wait: partitions never wait for each other's transactions, and
        a partition's next fold waits only for its own previous transaction (it needs
        those states). With ``batch_max_records`` buffered, the loop waits for a
        pipeline before it fetches more."""
        for tp, records in batch.items():
            if tp.partition in self.tasks:
                self.buffered.setdefault(tp.partition, []).extend(records)
        now = time.monotonic()
        if now - self._last_punctuate >= self.config.tick_interval_s:
            self._last_punctuate = now
            self.punctuate_pending.update(self.tasks)
        overdue = {p for p, since in self.held_since.items() if now - since >= self.config.align_max_ms / 1000}
        for p in self.buffered.keys() | self.punctuate_pending | overdue:
            running = self.inflight.get(p)
            if running is None or running.done():
                if running is not None:
                    running.result()  # a bug of ours in a pipeline stops the worker, as in the loop itself
                self.inflight[p] = asyncio.create_task(self._pipeline(p))
        while self.inflight and sum(map(len, self.buffered.values())) >= self.config.batch_max_records:
            done, _ = await asyncio.wait(list(self.inflight.values()), return_when=asyncio.FIRST_COMPLETED)
            self._reap(done)

    async def _pipeline(self, p: int) -> None:
        """Fold and commit ``p``'s buffered records until none are left."""
        gap = self.config.commit_gap_ms / 1000
        while True:
            # Let the broker write the last commit's markers first (records gather meanwhile).
            wait = self.committed_at.get(p, 0.0) + gap - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            fresh = self.buffered.pop(p, [])
            punctuate = p in self.punctuate_pending
            self.punctuate_pending.discard(p)
            task = self.tasks.get(p)
            if task is None:  # dropped (its transaction failed, or fenced): consumed again once recovered
                return
            since = self.held_since.get(p)
            overdue = since is not None and time.monotonic() - since >= self.config.align_max_ms / 1000
            if not fresh and not punctuate and not overdue:  # what the task holds waits for the other input
                return
            caught_up, lagging = await self._positions(p, fresh)
            if self.tasks.get(p) is not task:  # dropped meanwhile: its records are consumed again
                return
            align = self.config.align_max_ms > 0 and not overdue
            out = task.fold(fresh, punctuate=punctuate, caught_up=caught_up, lagging=lagging if align else ())
            if not task.holding:  # an overdue fold (no alignment) always ends here
                self.held_since.pop(p, None)
            elif since is None:
                self.held_since[p] = time.monotonic()
            if out:
                await self._commit(p, task, out)
            else:
                task.committed(out)

    def _reap(self, done) -> None:
        for p, running in list(self.inflight.items()):
            if running in done:
                del self.inflight[p]
                running.result()

    def _forget_buffered(self, p: int | None = None) -> None:
        """Records not folded yet are dropped: the partition resumes from its committed offsets when recovered.

        (Records a task holds go with the task, which is dropped after this.)"""
        if p is None:
            self.buffered.clear()
            self.held_since.clear()
            self.punctuate_pending.clear()
        else:
            self.buffered.pop(p, None)
            self.held_since.pop(p, None)
            self.punctuate_pending.discard(p)

    async def drain(self) -> None:
        """Wait for every pipeline in flight (each ends once its buffer is empty)."""
        while self.inflight:
            await asyncio.gather(*[self.inflight.pop(p) for p in list(self.inflight)])

    async def _positions(self, p: int, records: list) -> tuple[bool, set[str]]:
        """Whether both inputs of ``p`` are consumed to their end (last stable offset) with ``records``,
        and the inputs (roles) known to hold more than that."""
        assert self.consumer is not None
        last: dict[str, int] = {}
        for r in records:
            last[r.topic] = r.offset + 1
        known = True
        lagging: set[str] = set()
        for topic in self.inputs[:2]:
            tp = TopicPartition(topic, p)
            end = self.consumer.last_stable_offset(tp)
            if end is None:
                end = self.consumer.highwater(tp)
            if end is None:
                known = False
                continue
            pos = last.get(topic)
            if pos is None:
                pos = await self.consumer.position(tp)
            if pos < end:
                lagging.add(self.roles[topic])
        return known and not lagging, lagging

    def _health_partition(self, run_id: str, p: int) -> int:
        """What the default partitioner picks for key ``run_id`` (all of a run's transitions on one partition).

        With agent.health partitioned like the inputs that is the input partition ``p``
        itself, which saves hashing every key again."""
        if self.health_partitions == self.config.partitions:
            return p
        return partition_of(run_id.encode(), self.health_partitions)

    async def _commit(self, p: int, task: PartitionTask, out: Batch) -> None:
        producer = self.producers[p]
        c = self.config
        began = time.monotonic()
        try:
            await producer.begin_transaction()
            outbox = _Outbox(producer)
            for t in out.transitions:
                await outbox.add(c.health_topic, self._health_partition(t.run_id, p), t.run_id.encode(), encode(t))
            for d in out.deadletters:
                letter = self._deadletter(d)
                partition = partition_of(letter["key"], self.deadletter_partitions) if letter["key"] else p % self.deadletter_partitions
                await outbox.add(c.deadletter_topic, partition, letter["key"], letter["value"], letter["headers"])
            for key, value in out.changes.items():
                await outbox.add(c.changelog_topic, p, key, value)
            await outbox.flush()
            if out.offsets:
                await producer.send_offsets_to_transaction(
                    {TopicPartition(t, p): o for t, o in out.offsets.items()}, c.app_id)
            metas = await outbox.delivered()
            await producer.commit_transaction()
        except ProducerFenced:
            task.discard()
            await self._fenced(p)
            return
        except (KafkaError, OSError, asyncio.TimeoutError) as exc:
            task.discard()
            await self._failed(p, out, exc)
            return
        ends = [meta.offset + n for topic, n, meta in metas if topic == c.changelog_topic]
        position = max(ends) if ends else None
        self.stores[p].write(out.changes, position)
        self._count_runs(task.committed(out))
        m = self.metrics
        m.transactions.labels("committed").inc()
        self.committed_at[p] = now = time.monotonic()
        m.transaction_seconds.observe(now - began)
        if out.consumed:
            m.batch_records.observe(out.consumed)
        m.count_batch(out.counts)
        now_ms = wall_clock_ms()
        for t in out.transitions:
            m.child(m.transitions, t.from_state or "none", t.to_state).inc()
            m.child(m.agent_transitions, m.agent_label(t.agent), t.to_state).inc()
            (m.timer_latency if t.reason in TIMER_REASONS else m.latency).observe(max(0.0, (now_ms - t.ts) / 1000))
        for d in out.deadletters:
            r = d.record
            log.warning("invalid message on %s[%d]@%d: %s", r.topic, r.partition, r.offset, d.error[:500])
        moved = False
        for topic, offset in out.offsets.items():
            tp = TopicPartition(topic, p)
            moved |= topic != c.ticks_topic and offset != self.committed.get(tp)
            self.committed[tp] = offset
        if moved:
            self.progress_at[p] = time.monotonic()

    def _deadletter(self, d: DeadLetter) -> dict:
        """The original message unchanged, with headers naming the error; cut to fit ``max_message_bytes``."""
        r = d.record
        value = r.value if r.value is not None else b""
        key = r.key
        headers = [(k, v if isinstance(v, (bytes, bytearray)) else str(v).encode()) for k, v in (r.headers or ())]
        extra = [
            ("error", d.error[:2000].encode()),
            ("error_reason", d.reason.encode()),
            ("source_topic", r.topic.encode()),
            ("source_partition", str(r.partition).encode()),
            ("source_offset", str(r.offset).encode()),
        ]
        room = self.config.max_message_bytes - _DEADLETTER_OVERHEAD
        size = len(value) + len(key or b"") + sum(len(k) + len(v) for k, v in headers)
        if size > room:
            # Too large to forward unchanged: keep what fits, say so (the source offset finds the original).
            headers = [(k, v) for k, v in headers if len(k) + len(v) <= 1024][:32]
            key = key[:1024] if key is not None else None
            keep = max(0, room - len(key or b"") - sum(len(k) + len(v) for k, v in headers))
            extra.append(("truncated", f"{len(value)}".encode()))
            value = value[:keep]
        return {"value": value, "key": key, "headers": headers + extra}

    async def _fenced(self, p: int) -> None:
        """Another worker owns ``p`` now: commit nothing more for it until the group assigns it again."""
        m = self.metrics
        m.transactions.labels("fenced").inc()
        m.produce_failures.inc()
        log.warning("partition %d: producer fenced (another worker owns it now); dropping it until reassigned", p)
        await self._drop(p)
        # If the group still gives it to this worker after two session timeouts, own it again.
        self.recover_at[p] = time.monotonic() + 2 * self.config.session_timeout_s

    async def _failed(self, p: int, out: Batch, exc: BaseException) -> None:
        """A transaction failed: abort it, recover the partition, consume its batch again."""
        m = self.metrics
        m.transactions.labels("aborted").inc()
        m.produce_failures.inc()
        for key, n in out.counts.items():
            if key[0] == "event" and key[1] != "ticks":
                m.child(m.redelivered, key[1]).inc(n)
        log.error("partition %d: transaction failed (%s: %s); recovering it and consuming its batch again",
                  p, type(exc).__name__, exc)
        producer = self.producers.get(p)
        if producer is not None:
            try:
                await asyncio.wait_for(producer.abort_transaction(), timeout=10)
            except Exception:  # the producer may be unusable now; a new one replaces it
                log.debug("abort failed", exc_info=True)
        await self._drop(p)
        self.recover_at[p] = time.monotonic()

    # -- lag and stalls --------------------------------------------------------------------
    async def watch(self) -> None:
        """Lag per owned input partition (high watermark − committed), stalls, and fenced partitions' retry."""
        assert self.consumer is not None
        now = time.monotonic()
        m = self.metrics
        for p in sorted(self.assigned):
            lagging = False
            for topic in self.inputs[:2]:
                tp = TopicPartition(topic, p)
                hw = self.consumer.highwater(tp)
                committed = self.committed.get(tp)
                if hw is None or committed is None:
                    continue
                lag = max(0, hw - committed)
                m.lag.labels(self.roles[topic], str(p)).set(lag)
                lagging |= lag > 0
            stalled = lagging and now - self.progress_at.get(p, now) >= self.config.stall_timeout_s
            if stalled and p not in self.stalled:
                m.stalls.inc()
                log.error("partition %d stalled: lag and no progress for %.0fs", p, now - self.progress_at[p])
                self.stalled.add(p)
            elif not stalled:
                self.stalled.discard(p)
        m.stalled.set(len(self.stalled))
        if self.config.malloc_trim_s and now - self._trimmed_at >= self.config.malloc_trim_s:
            self._trimmed_at = now
            took = memory.trim()
            if took is not None:
                m.malloc_trim.observe(took)
        for p, at in sorted(self.recover_at.items()):
            if now < at or self.stopping.is_set():
                continue
            async with self.lock:
                if p not in self.assigned:
                    self.recover_at.pop(p, None)
                    continue
                if p in self.tasks:
                    continue
                try:
                    await self._recover([p])
                    log.info("partition %d recovered", p)
                except (KafkaError, OSError, asyncio.TimeoutError) as exc:
                    log.error("partition %d: recovery failed (%s: %s); retrying", p, type(exc).__name__, exc)
                    await self._drop(p)
                    self.recover_at[p] = time.monotonic() + min(30.0, 1.0 + (now - at))


async def _quietly(step, what: str) -> None:
    """Await a shutdown step; a failure (the broker may be gone) is logged, not raised."""
    try:
        await step
    except (Exception, asyncio.CancelledError) as exc:  # noqa: BLE001 - shutting down regardless
        log.warning("%s failed during shutdown: %s: %s", what, type(exc).__name__, exc)


class _Outbox:
    """A transaction's records, one batch per topic partition (``send_batch``): no per-record send."""

    def __init__(self, producer: AIOKafkaProducer) -> None:
        self.producer = producer
        self.open: dict[tuple[str, int], object] = {}
        self.sent: list[tuple[str, int, asyncio.Future]] = []  # (topic, records, future of the batch)

    async def add(self, topic: str, partition: int, key: bytes | None, value: bytes | None, headers=()) -> None:
        batch = self.open.get((topic, partition))
        if batch is None:
            batch = self.open[topic, partition] = self.producer.create_batch()
        if batch.append(key=key, value=value, timestamp=None, headers=list(headers)) is not None:
            return
        if batch.record_count():  # full: send it, start the next one
            await self._send(topic, partition, batch)
            batch = self.open[topic, partition] = self.producer.create_batch()
            if batch.append(key=key, value=value, timestamp=None, headers=list(headers)) is not None:
                return
        # Larger than a batch on its own (a dead letter near the size limit).
        future = await self.producer.send(topic, value, key=key, partition=partition, headers=list(headers))
        self.sent.append((topic, 1, future))

    async def _send(self, topic: str, partition: int, batch) -> None:
        n = batch.record_count()
        self.sent.append((topic, n, await self.producer.send_batch(batch, topic, partition=partition)))

    async def flush(self) -> None:
        for (topic, partition), batch in self.open.items():
            if batch.record_count():
                await self._send(topic, partition, batch)
        self.open.clear()

    async def delivered(self) -> list[tuple[str, int, object]]:
        """Wait for every batch's ack; (topic, records, RecordMetadata of its first record)."""
        metas = await asyncio.gather(*(f for _, _, f in self.sent))
        return [(topic, n, meta) for (topic, n, _), meta in zip(self.sent, metas)]


def run_worker(config: Config, verifiers=None) -> int:
    """Run one worker until SIGTERM/SIGINT; exit by ``shutdown_timeout_s`` after the signal whatever happens.

    ``verifiers``: loopwarden.trust.TrustedVerifiers, or None (every receipt counts)."""
    quiet_repeats()
    for name in ("aiokafka", "aiohttp.access"):  # their INFO lines (joins, coordinators) say nothing a user needs
        logging.getLogger(name).setLevel(max(logging.WARNING, logging.getLevelName(config.log_level.upper())))
    logging.basicConfig(level=config.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    gctune.for_streaming()  # fewer collector passes: a batch allocates many short-lived objects

    async def main() -> None:
        worker = Worker(config, verifiers=verifiers)
        from loopwarden.streams.http import serve

        loop = asyncio.get_running_loop()

        def on_signal() -> None:
            if worker.stopping.is_set():
                return
            log.info("stopping (exit within %.0fs)", config.shutdown_timeout_s)
            watchdog = threading.Timer(config.shutdown_timeout_s, _exit_now, args=(config.shutdown_timeout_s,))
            watchdog.daemon = True
            watchdog.start()
            worker.stop()

        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, on_signal)
        runner = await serve(worker)
        try:
            await worker.run()
        finally:
            await runner.cleanup()

    asyncio.run(main())
    return 0


def _exit_now(timeout_s: float) -> None:
    log.critical("worker did not stop within %.0fs (broker unreachable?); exiting now", timeout_s)
    logging.shutdown()
    os._exit(EXIT_STOP_TIMEOUT)
