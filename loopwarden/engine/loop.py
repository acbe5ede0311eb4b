"""The engine: runs one stage's batched, exactly-once consume → fold → produce loop on aiokafka.

:meth:`Engine.run` is the loop: poll a batch, hand each owned partition its records and start its pipeline
(fold, then one transaction: :mod:`loopwarden.engine.checkpoint`), punctuate on the stage's interval, watch lag
and stalls, retry partitions not owned (beside the loop: :mod:`loopwarden.engine.reowning`). Partitions never
wait for each other's transactions; a partition's next fold waits for its own previous commit (it needs those
states). Everything a partition has is one :class:`~loopwarden.engine.partition.OwnedPartition`; owning one is
:mod:`loopwarden.engine.recovery`; what a stage is, :mod:`loopwarden.engine.stage`; the group's committed
offsets follow the transactions from :mod:`loopwarden.engine.groupcommit`.

A transaction that fails drops its partition and owns it again from the changelog and the committed offsets
(its batch is consumed again); one fenced drops it until the group assigns it again or two session timeouts pass.
What waits in memory is bounded by :mod:`loopwarden.engine.inputbound`.

**A batch fetched across an owning** (docs/decisions.md): aiokafka fetches for a new assignment while
:meth:`assign` owns it, so ``getmany`` can return records from before the seek to the changelog's
offsets; the loop takes no batch returned across an owning (``PartitionManager.hand_out``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener
from aiokafka.errors import ProducerFenced

from loopwarden.engine.assignment import CoPartitionedAssignor
from loopwarden.engine.checkpoint import Checkpoint
from loopwarden.engine.config import EngineConfig
from loopwarden.engine.groupcommit import GroupCommitter
from loopwarden.engine.layoutguard import LayoutGuard
from loopwarden.engine.manager import RECOVERABLE, PartitionManager, quietly, unless_stopped
from loopwarden.engine.metrics import EngineMetrics
from loopwarden.engine.outputs import Router, deadletter_output
from loopwarden.engine.partition import AssignedPartition, OwnedPartition
from loopwarden.engine.recovery import restoring_consumer
from loopwarden.engine.reowning import Reowning
from loopwarden.engine.security import client_options
from loopwarden.engine.horizons import Horizons
from loopwarden.engine.inputbound import InputBound
from loopwarden.engine.stage import Folded, Stage
from loopwarden.engine.watch import Watch

log = logging.getLogger("loopwarden.worker")


class _Rebalance(ConsumerRebalanceListener):
    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    async def on_partitions_revoked(self, revoked) -> None:
        await self.engine.release()

    async def on_partitions_assigned(self, assigned) -> None:
        await self.engine.assign({tp.partition for tp in assigned})


class Engine:
    """One worker of a stage: its consumer, its assigned partitions, the loop."""

    def __init__(self, config: EngineConfig, stage: Stage, metrics: EngineMetrics | None = None,
                 on_recovered: Callable[[], None] | None = None) -> None:
        self.config = config
        self.stage = stage
        self.metrics = metrics or EngineMetrics()
        self.untracked = frozenset(i.topic for i in stage.inputs if not i.tracked)
        self.assignor = CoPartitionedAssignor(config.advertised_url)
        self.router = Router(config.partitions, stage.keyed_like_input)
        self.partitions = PartitionManager(config, stage, self.metrics, self.router)
        self.ready = False
        # Rebalance steps, owning a partition and handing out a batch take turns; pipelines run outside
        # it, and a rebalance drains them (under the lock) before it drops any partition.
        self.lock = asyncio.Lock()
        self.stopping = asyncio.Event()
        self.on_recovered = on_recovered  # the process's hook after partitions are owned (the CLI freezes the GC)
        self.consumer: AIOKafkaConsumer | None = None
        self.watch: Watch | None = None
        self.reowning = Reowning(config, self.partitions, self.lock, self.stopping)  # owning again beside the loop
        self.guard = LayoutGuard(stage.layout_watch(), config.topology_check_s, self.assignor, self.partitions,
                                 self.metrics, self.lock, self.reowning)  # pauses or holds while the layout is wrong
        self.horizons = Horizons(config, self.partitions)  # after an expansion: how far old partitions were forwarded
        self.group = GroupCommitter(self)  # the group's offsets, after the transactions (groupcommit.py)
        self.bound = InputBound(config.input_buffer_max_bytes, self.metrics, stage.name)  # what waits in memory

    @property
    def blocked(self) -> str | None:
        """Why the topic layout stops processing now (None: it does not)."""
        return self.guard.blocked

    @property
    def assigned(self) -> dict[int, AssignedPartition]:
        return self.partitions.assigned

    def owned_partitions(self) -> dict[int, OwnedPartition]:
        return self.partitions.owned()

    # -- the loop ---------------------------------------------------------------------
    async def run(self) -> None:
        """Join the group, then poll → process (fold and commit per partition) → punctuate → watch, until stopped."""
        if not await unless_stopped(self.start(), self.stopping):  # a signal while its clients bootstrap (~30 s)
            return await self._stop_consumers(" while starting")
        assert self.consumer is not None and self.watch is not None
        c = self.config
        try:
            while not self.stopping.is_set():
                seeks = self.partitions.seeks
                batch = await self.consumer.getmany(timeout_ms=c.batch_wait_ms or 1, max_records=c.batch_max_records)
                await self.guard.check()
                async with self.lock:
                    self.partitions.hand_out(batch, seeks)
                    if self.blocked is None:  # nothing is folded on a layout that broke co-partitioning
                        self.partitions.punctuate(self.stage.punctuate_every_s)
                        await self.process()
                    for part in await self.partitions.pass_markers():  # idle ones' offsets over transaction markers
                        self.group.behind(part)
                self.watch.check(self.assigned)
                self.group.check()
                self.reowning.start_due()  # beside the loop (reowning.py)
        finally:
            await self.shutdown()

    async def process(self) -> None:
        """Start the pipeline of each partition with work; while ``batch_max_records`` records are buffered, or
        what waits fills ``input_buffer_max_bytes`` (:mod:`loopwarden.engine.inputbound`), wait for one."""
        parts, bound = self.owned_partitions().values(), self.bound
        self._start(parts)
        while True:
            full = bound.full(parts)  # by bytes, and below by number
            if not full and sum(len(part.buffered) for part in parts) < self.config.batch_max_records:
                return
            running = [part.pipeline for part in parts if part.pipeline is not None and not part.pipeline.done()]
            if not running:
                if full and bound.unhold(parts):  # held records fill it alone: paused, or folded as they are
                    self._start(parts)
                    continue
                return
            if full:
                bound.waited()
            done, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                task.result()

    def _start(self, parts) -> None:
        now = time.monotonic()
        for part in parts:
            if part.buffered or part.punctuate or part.alignment.overdue(now):
                running = part.pipeline
                if running is None or running.done():
                    if running is not None:
                        running.result()  # a bug of ours in a pipeline stops the worker, as in the loop itself
                    part.pipeline = asyncio.create_task(self._pipeline(part))

    async def _pipeline(self, part: OwnedPartition) -> None:
        """Fold and commit ``part``'s buffered records until none are left."""
        gap = self.config.commit_gap_ms / 1000
        while True:
            # Let the broker write the last commit's markers first (records gather meanwhile).
            wait = part.committed_at + gap - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            if not self.partitions.owns(part):  # dropped (failed, fenced): consumed again once owned
                return
            overdue = part.alignment.overdue()
            records, fed, punctuate = part.take()
            if not records and not punctuate and not overdue:  # what the task holds waits for the other input
                return
            await self.horizons.before_fold(part, self.assigned.get(part.number), records)
            caught_up, lagging = await part.alignment.lagging(part.buffered_topics)
            if not self.partitions.owns(part):
                return
            waited = part.alignment.wait_for(lagging, overdue)
            result = part.task.fold(records, punctuate=punctuate, caught_up=caught_up, lagging=waited)
            part.alignment.folded(part.task.holding, records, fed, waited, held=part.task.held_topics)
            if result:
                await self._commit(part, result, records)
            else:
                part.after_commit(result, None)

    async def _commit(self, part: OwnedPartition, result: Folded, records: list) -> None:
        c, stage = self.config, self.stage
        dead = [deadletter_output(d, stage.deadletter_topic, self.router.counts[stage.deadletter_topic],
                                  c.max_message_bytes) for d in result.deadletters]
        checkpoint = Checkpoint(part.producer, part.number, c.app_id, stage.changelog_topic, self.router)
        record, offsets = None, None
        if result.offsets:
            # The offsets go to the changelog with every transaction: recovery reads them with the state they
            # go with (the group's, read just after a commit, may not show it yet: aiokafka has no KIP-447
            # stable offsets). The group's follow from the consumer once this commits (groupcommit.py); with
            # commit_offsets_ms=0 they go in the transaction, of every input as in the record.
            a = self.assigned.get(part.number)
            record, offsets = part.offsets_record(a.committed if a is not None else {}, result.offsets, records)
        try:
            committed = await checkpoint.commit(result, dead, offsets_record=record, begun=part.take_begun(),
                                                group_offsets=offsets if c.commit_offsets_ms == 0 else None)
        except ProducerFenced:
            part.after_abort(result)
            await self.partitions.fenced(part)
            return
        except RECOVERABLE as exc:
            part.after_abort(result)
            await self.partitions.failed(part, exc)
            return
        part.committed_at = time.monotonic()
        part.begin_next()
        part.after_commit(result, committed)
        committed.record(self.metrics, result)
        a = self.assigned.get(part.number)
        if a is not None:
            a.progressed(result.offsets, self.untracked)
        if result.offsets and c.commit_offsets_ms != 0:
            self.group.behind(part)  # committed by the consumer within commit_offsets_ms, off this pipeline

    # -- rebalance and lifecycle ------------------------------------------------------
    async def assign(self, partitions: set[int]) -> None:
        async with self.lock:
            self.partitions.pauses.assigned()  # aiokafka fetches every partition of a new assignment
            self.partitions.assigned = {p: AssignedPartition(p) for p in sorted(partitions)}
            t0 = time.monotonic()
            try:
                await self.partitions.own(sorted(partitions))
            except RECOVERABLE as exc:
                # a retriable error (a leader being elected on a fresh cluster) is a warning: one that never
                # clears leaves the partitions without progress, and the watch reports them stalled
                log.log(logging.WARNING if getattr(exc, "retriable", False) else logging.ERROR,
                        "recovering partitions %s failed (%s: %s); retrying", sorted(partitions), type(exc).__name__, exc)
                for a in self.assigned.values():
                    a.recover_at = time.monotonic() + 1.0
            if self.on_recovered is not None:
                self.on_recovered()
            self.ready = True
            self.guard.assigned()  # the group's output counts; a rebalance may follow a partition-count change: look now
            owned = self.owned_partitions()
            log.info("partitions %s recovered in %.2fs%s", sorted(owned), time.monotonic() - t0,
                     self.stage.summary([part.task for part in owned.values()]))

    async def release(self) -> None:
        """Partitions are about to be reassigned: finish the pipelines in flight, then drop every partition."""
        async with self.lock:
            self.ready = False
            self.partitions.forget_buffered()  # consumed again from the committed offsets by whoever owns them next
            await self.reowning.cancel()  # before the next owner can fence: no retry of ours starts a producer after
            await self.drain()
            for p in await self.partitions.revoke():
                if self.watch is not None:
                    self.watch.forget(p)

    async def drain(self) -> None:
        """Wait for every pipeline in flight (each ends once its buffer is empty); then commit the group's offsets
        where they are behind (for lag tools, settling, and workers older than the changelog's offsets record)."""
        parts = [part for part in self.owned_partitions().values() if part.pipeline is not None]
        pipelines = [part.pipeline for part in parts]
        for part in parts:
            part.pipeline = None
        await asyncio.gather(*pipelines)
        await quietly(asyncio.wait_for(self.group.commit(), 10), "committing the group's offsets")

    async def start(self) -> None:
        c = self.config
        await self.stage.prepare()
        restorer = self.partitions.restorer = restoring_consumer(c)
        await restorer.start()
        self.consumer = AIOKafkaConsumer(
            **client_options(c), group_id=c.app_id, enable_auto_commit=False, auto_offset_reset="earliest",
            isolation_level="read_committed", partition_assignment_strategy=(self.assignor,),
            session_timeout_ms=int(c.session_timeout_s * 1000),
            heartbeat_interval_ms=max(100, int(c.session_timeout_s * 1000 / 6)),
            max_partition_fetch_bytes=max(1_048_576, c.max_message_bytes + 65536),
            fetch_max_bytes=64 * 1_048_576, fetch_max_wait_ms=50)
        self.partitions.consumer = self.partitions.pauses.consumer = self.consumer
        self.watch = Watch(self.consumer, self.partitions.tracked, self.metrics, c.stall_timeout_s, c.malloc_trim_s)
        self.consumer.subscribe(list(self.partitions.topics), listener=_Rebalance(self))
        await self.consumer.start()
        await self.guard.start()
        self.group.start()

    def stop(self) -> None:
        self.stopping.set()

    async def shutdown(self) -> None:
        """Finish the transactions in flight, stop the producers, leave the group (its partitions move at once).

        With the broker gone any step can fail: each is tried, none stops the others."""
        await self.group.stop()  # drain commits what is behind, once
        async with self.lock:
            self.ready = False
            self.partitions.forget_buffered()
            await self.reowning.cancel()
            await quietly(self.drain(), "finishing the transactions in flight", " during shutdown")
            for p in list(self.assigned):
                await quietly(self.partitions.drop(p), f"stopping partition {p}", " during shutdown")
        await self._stop_consumers(" during shutdown")
        await quietly(self.guard.stop(), "stopping the layout watch", " during shutdown")
        await self.horizons.stop()

    async def _stop_consumers(self, when: str) -> None:
        for client in filter(None, (self.consumer, self.partitions.restorer)):
            await quietly(client.stop(), "stopping a consumer", when)
