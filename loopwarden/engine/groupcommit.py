"""The group's committed offsets: committed by the group's consumer after the transactions, off the pipelines.

Every transaction writes the input offsets it consumed up to as the changelog's engine record,
and recovery seeks to the further of that record and the group's committed offsets
(:func:`loopwarden.engine.recovery.seek_committed`): the changelog is the source of truth, the
group's offsets are for lag tools, for settling after an expansion, and for workers older than
the record. :class:`GroupCommitter` commits them with the consumer (``AIOKafkaConsumer.commit``,
one OffsetCommit for every owned partition behind, fenced by the group's generation) at most every
``commit_offsets_ms``, in a task of its own, so a transaction carries no AddOffsetsToTxn and TxnOffsetCommit (two round
trips to the coordinators).

Exactly-once holds because the offsets it commits are those of transactions already committed
(``AssignedPartition.committed`` moves only after a commit, or over control records only:
``OwnedPartition.pass_markers``): the group's offsets can trail the changelog's record, never pass
it but over transaction markers, whatever commits late (a zombie's is refused by its stale
generation; one that lands anyway carries offsets the changelog already holds, and recovery takes
the further). A ``read_committed`` reader of the changelog may still, for a moment, see them pass:
the broker answers EndTxn before it writes the transaction's markers. Recovery never reads in that
moment (the producer it starts first completes the transaction).

A failed commit is logged, counted (``loopwarden_group_commits_total{result="failed"}``) and tried
again after the interval (1 s at least); it never drops a partition. Until one succeeds for a
partition, ``OwnedPartition.group_behind`` stays true.

``commit_offsets_ms=0`` is for a group shared with workers that do not read the changelog's record: the group's offsets go with every transaction (``send_offsets_to_transaction``), and
this commits only what recovery found behind.
"""

from __future__ import annotations

import asyncio
import logging
import time

from aiokafka import TopicPartition

from loopwarden.engine.manager import RECOVERABLE

log = logging.getLogger("loopwarden.worker")


class GroupCommitter:
    """Commits the owned partitions' offsets that are behind, at most every ``commit_offsets_ms``."""

    def __init__(self, engine) -> None:
        self.engine = engine  # its config, metrics, group consumer and assigned partitions
        self.lock = asyncio.Lock()  # one commit at a time: the group's offsets never go back through us
        self.due = asyncio.Event()  # a partition is behind
        self.next_at = 0.0  # monotonic time before which no commit starts (the interval, or a backoff)
        self.task: asyncio.Task | None = None

    def start(self) -> None:
        self.task = asyncio.create_task(self._run(), name="group offsets")

    def check(self) -> None:
        """A bug of ours in the committer's task stops the worker, as one in a pipeline does."""
        if self.task is not None and self.task.done() and not self.task.cancelled():
            self.task.result()

    async def stop(self) -> None:
        """Stop the task (a commit it has in flight finishes on the broker or not at all: :meth:`commit` follows)."""
        if self.task is not None:
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)
            self.task = None

    def behind(self, part) -> None:
        """``part`` committed a transaction whose offsets the group does not have yet."""
        part.group_behind = True
        self.due.set()

    async def _run(self) -> None:
        while True:
            try:  # woken by a commit, or a look every second at least (recovery may find a partition behind)
                await asyncio.wait_for(self.due.wait(), timeout=max(1.0, self.engine.config.commit_offsets_ms / 1000))
            except asyncio.TimeoutError:
                pass
            wait = self.next_at - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            self.due.clear()
            await self.commit()

    async def commit(self) -> bool:
        """Commit the offsets of every owned partition behind (its last committed transaction's); whether it
        succeeded (True with nothing behind). Called by the task, and by the engine before it gives partitions up."""
        async with self.lock:
            engine, every = self.engine, self.engine.config.commit_offsets_ms / 1000
            behind = {a.owned: dict(a.committed) for a in engine.assigned.values()
                      if a.owned is not None and a.owned.group_behind and a.committed}
            if not behind or engine.consumer is None:
                return True
            now = time.monotonic()
            self.next_at = now + every
            offsets = {TopicPartition(t, part.number): o for part, committed in behind.items()
                       for t, o in committed.items()}
            try:
                await engine.consumer.commit(offsets)
            except RECOVERABLE as exc:
                engine.metrics.group_commits.labels("failed").inc()
                log.warning("committing the group's offsets of partitions %s failed (%s: %s); trying again",
                            sorted(p.number for p in behind), type(exc).__name__, exc)
                self.next_at = now + max(every, 1.0)
                self.due.set()
                return False
            engine.metrics.group_commits.labels("committed").inc()
            for part, committed in behind.items():
                a = engine.assigned.get(part.number)
                if a is not None and a.owned is part and a.committed == committed:  # no transaction since
                    part.group_behind = False
            return True
