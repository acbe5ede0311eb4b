"""What the engine does with the topology verdict (:mod:`loopwarden.stages.health.topology`).

Every ``topology_check_s`` and after a rebalance the layout is read again. While it is not
right the engine folds nothing: its input partitions are paused, ``/readyz`` says why.

An output topic that is missing or has another partition count than at start (deleted, and
perhaps auto-created by the broker with its default count) also leaves transactions waiting
for partitions that do not exist, forever. So while the verdict says ``produce=False`` every
owned partition is *held*: its pipeline is cancelled, its open transaction aborted (and, if
the abort cannot finish, fenced by the next owner's ``InitProducerId``), its producer
stopped. Nothing is lost: a dropped partition is consumed again from its committed offsets
and its store restored from the changelog when it is owned again. It is owned again only
once the output has its start count again; owning re-learns the outputs' partition counts
(:meth:`loopwarden.engine.outputs.Router.learn`). An output re-created with another count
keeps the worker blocked, the reason in the log and ``/readyz``, until it is deleted and
created with the start count (docs/topics.md).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

from aiokafka import TopicPartition

from loopwarden.engine.manager import RECOVERABLE

if TYPE_CHECKING:
    from loopwarden.engine.assignment import CoPartitionedAssignor
    from loopwarden.engine.manager import PartitionManager
    from loopwarden.engine.metrics import EngineMetrics
    from loopwarden.engine.partition import OwnedPartition
    from loopwarden.engine.reowning import Reowning
    from loopwarden.engine.stage import LayoutWatch

log = logging.getLogger("loopwarden.worker")
ABORT_TIMEOUT_S = 2.0  # an abort waits for the transaction's sends: those to a missing partition never end


class LayoutGuard:
    """Applies the layout verdict to one engine: pause while not ok, hold every partition while outputs are wrong.

    ``watch``: the stage's (None: not watched); ``check_s``: how often it is read; ``assignor``: the group's output
    counts, and where this worker's are advertised; ``lock``: the engine's, a hold takes turns with the loop;
    ``reowning``: the retries a hold cancels first."""

    def __init__(self, watch: LayoutWatch | None, check_s: float, assignor: CoPartitionedAssignor,
                 partitions: PartitionManager, metrics: EngineMetrics, lock: asyncio.Lock, reowning: Reowning) -> None:
        self.watch = watch
        self.check_s = check_s
        self.assignor, self.partitions, self.metrics = assignor, partitions, metrics
        self.lock, self.reowning = lock, reowning
        self.checked_at = 0.0
        self.held = False  # the partitions are dropped because an output's layout is wrong
        self.blocked: str | None = None  # why the layout stops processing now (None: it does not)

    def soon(self) -> None:
        """Read the layout at the next turn (a rebalance may follow a partition-count change)."""
        self.checked_at = 0.0

    def assigned(self) -> None:
        """At an assignment: hold the outputs to the group's counts, and look at the layout at the next turn."""
        if self.watch is not None:
            self.watch.hold_to(self.assignor.group_outputs)
        self.soon()

    async def start(self) -> None:
        if self.watch is None:
            return
        await self.watch.start()
        if await self.watch.auto_create_enabled():
            log.warning("the brokers have auto.create.topics.enable=true: a deleted output topic comes back "
                        "with their default partition count; set it to false (docs/topics.md)")

    async def stop(self) -> None:
        if self.watch is not None:
            await self.watch.stop()

    async def check(self) -> None:
        """Every ``topology_check_s`` (and after a rebalance): stop or resume processing as the layout says."""
        now = time.monotonic()
        if self.watch is None or now - self.checked_at < self.check_s:
            return
        self.checked_at = now
        try:
            verdict, _changed = await self.watch.check()
        except RECOVERABLE as exc:
            log.warning("reading the topic layout failed (%s: %s); trying again", type(exc).__name__, exc)
            return
        self.assignor.outputs = dict(self.watch.expected_outputs)  # advertised at a rejoin
        blocked = None if verdict.ok else verdict.reason()
        pauses = self.partitions.pauses
        if blocked is not None:  # at every check: partitions owned after a rebalance are paused too
            pauses.pause("layout", [TopicPartition(t, p) for p in self.partitions.owned() for t in self.partitions.topics])
        if blocked != self.blocked:
            self.blocked = blocked
            self.metrics.topology_blocked.set(blocked is not None)
            if blocked is not None:
                self.metrics.topology_changes.inc()
                log.error("topic layout: %s; processing stopped until the layout is right again", blocked)
            else:
                log.warning("topic layout is right again: processing resumes")
                pauses.resume("layout", pauses.paused("layout"))
        if not verdict.produce:
            await self.hold()  # at each check: a rebalance meanwhile may have owned partitions again
        elif self.held:
            self.release()

    async def hold(self) -> None:
        """Drop every owned partition: cancel its pipeline, abort its transaction, stop its producer."""
        async with self.lock:
            await self.reowning.cancel()  # a retry under way would own a partition again behind the hold
            owned = self.partitions.owned()
            if owned:
                log.error("partitions %s: an output topic's layout changed; aborting their transactions and "
                          "holding them until it is right again (their batches are consumed again)", sorted(owned))
            await asyncio.gather(*(self._abort(part) for part in owned.values()))
            await asyncio.gather(*(self.partitions.drop(p) for p in owned))  # each producer's stop is bounded
            for a in self.partitions.assigned.values():
                a.recover_at = None  # owned again by release(), not by the retry loop
            self.held = True

    async def _abort(self, part: OwnedPartition) -> None:
        pipeline, part.pipeline = part.pipeline, None
        if pipeline is not None and not pipeline.done():
            pipeline.cancel()
            await asyncio.gather(pipeline, return_exceptions=True)
            self.metrics.transactions.labels("aborted").inc()
        part.task.discard()  # what it folded was not committed: the store holds the committed states
        try:  # with no transaction open this fails at once; a hung one may not end: the next owner fences it
            await asyncio.wait_for(part.producer.abort_transaction(), timeout=ABORT_TIMEOUT_S)
        except (Exception, asyncio.CancelledError):  # noqa: BLE001 - the producer is stopped next regardless
            log.debug("partition %d: abort failed", part.number, exc_info=True)

    def release(self) -> None:
        """The outputs are right again: own every held partition now (owning re-learns their counts)."""
        now = time.monotonic()
        for a in self.partitions.assigned.values():
            if a.owned is None:
                a.recover_at = now
        self.held = False
        log.warning("output topics are right again: owning partitions %s again", sorted(self.partitions.assigned))
