"""The partitions a worker is assigned, and owning them (Kafka Streams' ``TaskManager``).

Owning a partition fences its earlier producers and restores its store (:meth:`PartitionManager.prepare`),
then seeks its inputs to the committed offsets (:meth:`PartitionManager.install`; both
:mod:`loopwarden.engine.recovery`'s); the result is one
:class:`~loopwarden.engine.partition.OwnedPartition`. A rebalance does both under the engine's lock
(:meth:`PartitionManager.own`). A failed transaction or a fence drops ownership (:meth:`failed`,
:meth:`fenced`: :meth:`drop`) and sets when to try again, beside the loop
(:mod:`loopwarden.engine.reowning`); the group revoking a partition forgets its
:class:`~loopwarden.engine.partition.AssignedPartition`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Coroutine
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.errors import KafkaError

from loopwarden.engine.alignment import Alignment
from loopwarden.engine.config import EngineConfig
from loopwarden.engine.metrics import EngineMetrics
from loopwarden.engine.partition import AssignedPartition, OwnedPartition, Stopping
from loopwarden.engine.pauses import Pauses
from loopwarden.engine.recovery import restore, seek_committed, transactional_producer
from loopwarden.engine.stage import Stage, Task
from loopwarden.engine.store import PartitionStore, open_partition
from loopwarden.engine.outputs import Router

log = logging.getLogger("loopwarden.worker")
RECOVERABLE = (KafkaError, OSError, asyncio.TimeoutError)


class Owning:
    """Partitions :meth:`PartitionManager.prepare` fenced and restored, not yet sought nor handed batches."""

    def __init__(self, producers: dict[int, AIOKafkaProducer]) -> None:
        self.producers = producers  # partition -> its transactional producer (started by prepare)
        self.stores: dict[int, PartitionStore] = {}
        self.tasks: dict[int, Task] = {}  # rebuilt from the restored stores

    async def discard(self) -> None:
        """Owning them failed or was given up: stop the producers, close the stores."""
        for p, producer in self.producers.items():
            await quietly(producer.stop(), f"stopping the producer of partition {p}")
        for store in self.stores.values():
            store.close()


class PartitionManager:
    """``assigned``: partition -> its :class:`AssignedPartition` (owned or not)."""

    def __init__(self, config: EngineConfig, stage: Stage, metrics: EngineMetrics, router: Router) -> None:
        self.config = config
        self.stage = stage
        self.metrics = metrics
        self.router = router
        self.topics = tuple(i.topic for i in stage.inputs)
        self.tracked = {i.topic: i.role for i in stage.inputs if i.tracked}
        self.assigned: dict[int, AssignedPartition] = {}
        self.consumer: AIOKafkaConsumer | None = None
        self.restorer: AIOKafkaConsumer | None = None
        self.seeks = 0  # times :meth:`own` sought inputs: a batch the loop got across one may predate the seek
        self.markers_at = 0.0  # monotonic time of the next :meth:`pass_markers`
        self.stopping = Stopping(metrics.producers_stopping)  # dropped partitions' producers still stopping
        # Why input partitions are not fetched (dropped, layout, ahead): the one owner of pause and resume.
        self.pauses = Pauses(lambda reason: metrics.inputs_paused.labels(stage.name, reason))

    def owned(self) -> dict[int, OwnedPartition]:
        return {p: a.owned for p, a in self.assigned.items() if a.owned is not None}

    def punctuate(self, every: float) -> None:
        """Mark each owned partition due for timers once per ``every`` seconds, each at its own phase of the
        interval (the i-th of n at i/n of it), so that their timer-firing folds do not all come at once."""
        now, owned = time.monotonic(), self.owned()
        for i, p in enumerate(sorted(owned)):
            owned[p].punctuate_if_due(now, every, i * every / len(owned))

    def forget_buffered(self) -> None:
        """Drop what every owned partition buffered, and stop its alignment's clock: consumed again later."""
        for part in self.owned().values():
            part.take()
            part.alignment.forget()

    def owns(self, part: OwnedPartition) -> bool:
        a = self.assigned.get(part.number)
        return a is not None and a.owned is part

    async def own(self, partitions: list[int]) -> None:
        """Own ``partitions`` (a rebalance's, under the engine's lock): :meth:`prepare` with the engine's restorer,
        then :meth:`install`."""
        if not partitions:
            return
        assert self.restorer is not None
        await self.install(await self.prepare(partitions, self.restorer), self.restorer)

    async def prepare(self, partitions: list[int], restorer: AIOKafkaConsumer) -> Owning:
        """Fence ``partitions``' earlier producers and restore their stores with ``restorer`` (a consumer nothing
        else uses meanwhile). Touches nothing the loop reads: a retry runs it beside the loop (reowning.py)."""
        c, stage = self.config, self.stage
        owning = Owning({p: transactional_producer(c, p) for p in partitions})
        try:
            # InitProducerId fences earlier owners and completes their open transaction: the changelog
            # and the committed offsets read below are final.
            await asyncio.gather(*(producer.start() for producer in owning.producers.values()))
            await self.router.learn(next(iter(owning.producers.values())), (*stage.outputs, stage.deadletter_topic))
            owning.stores = {p: open_partition(c.store, c.data_dir, c.app_id, p, stage.store_name) for p in partitions}
            self.metrics.restored.inc(await restore(restorer, stage.changelog_topic, owning.stores))
            owning.tasks = {p: stage.task(p, owning.stores[p]) for p in partitions}
            for task in owning.tasks.values():
                await rebuilt(task)
        except BaseException:
            await owning.discard()
            raise
        return owning

    async def install(self, owning: Owning, reader: AIOKafkaConsumer) -> None:
        """Resume what :meth:`prepare` restored at the committed offsets and own it from now on (under the engine's
        lock: no batch is handed out meanwhile; ``reader`` looks up the marks)."""
        assert self.consumer is not None
        partitions = sorted(owning.producers)
        stores = owning.stores
        try:
            behind: set[int] = set()  # the group's offsets behind the changelog's (after a crash): sent once idle
            offsets, marks = await seek_committed(self.consumer, self.topics, partitions, stores, behind, reader=reader)
            self.seeks += 1  # counted as soon as they are sought (all or none: no await among the seeks)
            # Fetched again if given up before (drop); a layout pause stays until the layout is right.
            self.pauses.resume("dropped", [TopicPartition(topic, p) for p in partitions for topic in self.topics])
        except BaseException:
            await owning.discard()
            raise
        c, stage = self.config, self.stage
        for p in partitions:
            part = OwnedPartition(p, stage, owning.tasks[p], stores[p], owning.producers[p],
                                  Alignment(self.consumer, p, self.tracked, c.align_max_ms, self.pauses))
            a = self.assigned[p]
            a.committed, a.recover_at, a.owned = offsets[p], None, part
            part.next_offsets, part.marks = dict(offsets[p]), marks[p]
            part.group_behind = p in behind
            part.after_restore()

    async def drop(self, p: int, retry_at: float | None = None) -> None:
        """Stop owning ``p`` (its inputs pause while it stays assigned); own it again at ``retry_at``, if given."""
        a = self.assigned.get(p)
        if a is None:
            return
        if retry_at is not None:
            a.recover_at = retry_at
        if a.owned is None:
            return
        part, a.owned = a.owned, None
        tps = [TopicPartition(topic, p) for topic in self.topics]
        self.pauses.pause("dropped", tps)
        self.pauses.resume("ahead", tps)  # its held records go with it
        await part.close(self.stopping)

    async def pass_markers(self, every_s: float = 0.5) -> list[OwnedPartition]:
        """At most every ``every_s``: the owned partitions whose committed offsets moved over the transaction
        markers after their last records (:meth:`OwnedPartition.pass_markers`). Under the engine's lock."""
        if time.monotonic() < self.markers_at or self.consumer is None:
            return []
        self.markers_at = time.monotonic() + every_s
        return [a.owned for a in list(self.assigned.values())
                if a.owned is not None and await a.owned.pass_markers(self.consumer, a, self.tracked)]

    def hand_out(self, batch: dict, seeks: int) -> None:
        """Buffer a batch ``getmany`` returned with each owned partition, unless partitions were owned since it was
        asked for (``seeks``: :attr:`seeks` then). aiokafka installs an assignment before it calls
        ``on_partitions_assigned``: while they are owned (fencing, restore), its fetcher resets them to the group's
        offsets and fetches, and ``getmany`` may return those records; seeking to the changelog's offsets drops
        what it prefetched or has in flight, not what it returned. Taken after the seek, records below it would be
        folded again and those at or past it would come twice (docs/decisions.md, "A batch fetched across an owning"). So
        none of such a batch is taken: each owned input in it is sought back to the offset its partition takes
        next, to come again in order."""
        across = self.seeks != seeks
        for tp, records in batch.items():
            a = self.assigned.get(tp.partition)
            if a is None or a.owned is None or not records:
                continue
            if not across:
                a.owned.accept(tp.topic, records)
                continue
            assert self.consumer is not None
            offset = a.owned.next_offsets.get(tp.topic, records[0].offset)
            self.consumer.seek(tp, offset)
            log.debug("%s[%d]: a batch got across an owning (%d..%d): fetched again from %d", tp.topic,
                      tp.partition, records[0].offset, records[-1].offset, offset)

    async def fenced(self, part: OwnedPartition) -> None:
        """A transaction of ``part`` was fenced: another worker owns it now; commit nothing more for it until the
        group assigns it again (if the group still gives it to this worker after two session timeouts, own it again).
        A pipeline of a partition dropped meanwhile (and perhaps owned again) drops nothing: its batch was never
        committed, and the ownership that replaced it consumes from the committed offsets."""
        if self._stale(part, "fenced"):
            return
        p = part.number
        m = self.metrics
        m.transactions.labels("fenced").inc()
        m.produce_failures.inc()
        log.warning("partition %d: producer fenced (another worker owns it now); dropping it until reassigned", p)
        await self.drop(p, retry_at=time.monotonic() + 2 * self.config.session_timeout_s)

    async def failed(self, part: OwnedPartition, exc: BaseException) -> None:
        """A transaction failed: abort it, own the partition again, consume its batch again."""
        if self._stale(part, f"failed ({type(exc).__name__}: {exc})"):
            return
        m = self.metrics
        m.transactions.labels("aborted").inc()
        m.produce_failures.inc()
        log.error("partition %d: transaction failed (%s: %s); recovering it and consuming its batch again",
                  part.number, type(exc).__name__, exc)
        try:
            await asyncio.wait_for(part.producer.abort_transaction(), timeout=10)
        except Exception:  # the producer may be unusable now; a new one replaces it
            log.debug("abort failed", exc_info=True)
        await self.drop(part.number, retry_at=time.monotonic())

    def _stale(self, part: OwnedPartition, what: str) -> bool:
        """Whether ``part`` is no longer the partition's owner (dropped while its transaction was in flight): its
        failure is its own, not the current ownership's."""
        if self.owns(part):
            return False
        log.info("partition %d: a transaction of an ownership already dropped %s; the current one is kept",
                 part.number, what)
        return True

    async def revoke(self) -> list[int]:
        """The group takes every partition back: drop them all and forget them."""
        assigned, self.assigned = self.assigned, {}
        for a in assigned.values():
            if a.owned is not None:
                part, a.owned = a.owned, None
                await part.close(self.stopping)
        return list(assigned)


async def rebuilt(task: Task) -> None:
    """``task.rebuild()`` a step at a time (``rebuild_steps``; the health stage's: 4,096 runs, ~6 µs a run), the
    event loop serving the other partitions between steps."""
    for _ in task.rebuild_steps():
        await asyncio.sleep(0)


async def quietly(step, what: str, when: str = "") -> None:
    """Await a step whose failure (the broker may be gone) is logged, not raised."""
    try:
        await step
    except (Exception, asyncio.CancelledError) as exc:  # noqa: BLE001 - going on regardless
        log.warning("%s failed%s: %s: %s", what, when, type(exc).__name__, exc)


async def unless_stopped(step: Coroutine[Any, Any, None], stopping: asyncio.Event) -> bool:
    """Run ``step`` unless ``stopping`` is set first: True when it finished (its error raised), False when it was
    cancelled because the process was told to stop meanwhile."""
    task = asyncio.ensure_future(step)
    stopped = asyncio.ensure_future(stopping.wait())
    try:
        await asyncio.wait((task, stopped), return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopped.cancel()
    if task.done():
        task.result()
        return True
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    return False
