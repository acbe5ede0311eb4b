"""One batch's transaction: outputs, dead letters, changelog and consumed offsets, committed together.

The consumed offsets are a changelog record of the engine's (``store.OFFSETS_KEY``) in every
transaction: a restart resumes from it or from the group's committed offsets, whichever is
further. The group's go with the transaction (``send_offsets_to_transaction``: AddOffsetsToTxn
and TxnOffsetCommit, two more round trips to the coordinators in sequence) only when the engine
asks (``commit_offsets_ms=0``); otherwise the consumer commits them afterwards
(:mod:`loopwarden.engine.groupcommit`).

A :class:`Checkpoint` is made fresh for each batch of a partition and committed once
(Quix Streams' ``Checkpoint.commit``; Kafka Streams' ``RecordCollector`` + EOS commit).
It records nothing: the engine records metrics from the :class:`Committed` it returns,
and handles what it raises (``ProducerFenced``: another worker owns the partition;
any other ``KafkaError``: abort, recover, consume the batch again).
"""

from __future__ import annotations

import asyncio
import copy
import logging
import time
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import TypeVar

from aiokafka import AIOKafkaProducer, TopicPartition
from aiokafka.errors import IllegalOperation, KafkaError, UnknownTopicOrPartitionError

from loopwarden.engine.stage import Folded, Output
from loopwarden.engine.store import OFFSETS_KEY
from loopwarden.engine.outputs import Router

log = logging.getLogger("loopwarden.worker")
T = TypeVar("T")


@dataclass(frozen=True)
class Committed:
    """What a committed checkpoint tells: the changelog offset the store now holds up to, and its cost."""

    position: int | None  # next changelog offset after this batch's records (None: it wrote none)
    seconds: float  # begin to commit: the broker round trips
    offsets: bytes | None = None  # the engine's offsets record it wrote to the changelog (None: none)

    def record(self, metrics, result: Folded) -> None:
        """The loop's metrics of this commit, and a log line per dead letter it wrote."""
        metrics.transactions.labels("committed").inc()
        metrics.transaction_seconds.observe(self.seconds)
        if result.consumed:
            metrics.batch_records.observe(result.consumed)
        for d in result.deadletters:
            r = d.record
            log.warning("invalid message on %s[%d]@%d: %s", r.topic, r.partition, r.offset, d.error[:500])


class Checkpoint:
    """A partition's batch, to be committed in one transaction by :meth:`commit`."""

    def __init__(self, producer: AIOKafkaProducer, partition: int, group_id: str, changelog_topic: str,
                 router: Router) -> None:
        self.producer = producer
        self.partition = partition
        self.group_id = group_id
        self.changelog_topic = changelog_topic
        self.router = router

    async def commit(self, result: Folded, deadletters: list[Output], *, offsets_record: bytes | None = None,
                     group_offsets: dict[str, int] | None = None, begun: Awaitable[None] | None = None) -> Committed:
        """In order: begin; the outputs, the dead letters, the changelog; the offsets; commit.

        ``offsets_record``: the input offsets (``recovery.encode_offsets``), written to the changelog as the
        engine's record; ``group_offsets``: input topic -> offset, also committed as the group's inside the
        transaction (AddOffsetsToTxn, TxnOffsetCommit), or None; ``begun``: the producer's ``begin_transaction()``
        already under way (:meth:`OwnedPartition.begin_next`), or None to begin it here."""
        began = time.monotonic()
        p, producer = self.partition, self.producer
        await (begun if begun is not None else producer.begin_transaction())
        outbox = _Outbox(producer)
        route, put = self.router.partition, outbox.put
        for o in result.outputs:
            partition = o.partition if o.partition is not None else route(o.topic, o.key, p)
            if not put(o.topic, partition, o.key, o.value, o.headers):
                await outbox.spill(o.topic, partition, o.key, o.value, o.headers)
        for o in deadletters:
            if not put(o.topic, o.partition, o.key, o.value, o.headers):  # type: ignore[arg-type]
                await outbox.spill(o.topic, o.partition, o.key, o.value, o.headers)  # type: ignore[arg-type]
        changelog = self.changelog_topic
        if result.changes:
            batch = outbox.batch(changelog, p)
            for key, value in result.changes.items():
                if batch.append(key=key, value=value, timestamp=None, headers=_NO_HEADERS) is None:
                    await outbox.spill(changelog, p, key, value)
                    batch = outbox.batch(changelog, p)
        if offsets_record is not None and not put(changelog, p, OFFSETS_KEY, offsets_record):
            await outbox.spill(changelog, p, OFFSETS_KEY, offsets_record)
        await outbox.flush()
        if group_offsets:
            await outbox.in_transaction(producer.send_offsets_to_transaction(
                {TopicPartition(t, p): o for t, o in group_offsets.items()}, self.group_id))
        metas = await outbox.delivered()
        await producer.commit_transaction()
        ends = [meta.offset + n for topic, n, meta in metas if topic == changelog]
        return Committed(max(ends) if ends else None, time.monotonic() - began, offsets_record)


class TransactionLost(KafkaError):
    """The producer left the transaction a batch was being sent in (its sender failed meanwhile): recover."""


_SETTLE_S = 1.0  # how long a lost transaction's sent batches may take to fail with its cause (a turn of the loop)
_NO_HEADERS: list = []  # BatchBuilder.append reads the list it is given, never keeps or changes it


class _Outbox:
    """A transaction's records, one batch per topic partition (``send_batch``): no per-record send.

    Records go into the open batch of their topic partition without a turn of the event loop
    (:meth:`put`, the changelog's loop on :meth:`batch`); only a full batch is sent before the
    rest (:meth:`spill`). Per produced record 0.31 µs instead of 0.45 µs with one coroutine per
    record (bench/HISTORY.md, "g latency")."""

    def __init__(self, producer: AIOKafkaProducer) -> None:
        self.producer = producer
        self.open: dict[tuple[str, int], object] = {}
        self.sent: list[tuple[str, int, asyncio.Future]] = []  # (topic, records, future of the batch)

    def batch(self, topic: str, partition: int):
        """The open batch of ``topic``/``partition`` (a new one if none)."""
        batch = self.open.get((topic, partition))
        if batch is None:
            batch = self.open[topic, partition] = self.producer.create_batch()
        return batch

    def put(self, topic: str, partition: int, key: bytes | None, value: bytes | None, headers=()) -> bool:
        """Append a record to its open batch; False: the batch is full (then :meth:`spill` it)."""
        return self.batch(topic, partition).append(
            key=key, value=value, timestamp=None, headers=list(headers) if headers else _NO_HEADERS) is not None

    async def spill(self, topic: str, partition: int, key: bytes | None, value: bytes | None, headers=()) -> None:
        """A record its open batch had no room for: send that batch, put the record in a new one."""
        batch = self.batch(topic, partition)
        if batch.record_count():  # full: send it, start the next one
            await self._send(topic, partition, batch)
            del self.open[topic, partition]
            if self.put(topic, partition, key, value, headers):
                return
        # Larger than a batch on its own (a dead letter near the size limit).
        await self._known(topic, partition)
        future = await self.in_transaction(self.producer.send(topic, value, key=key, partition=partition,
                                                              headers=list(headers)))
        self.sent.append((topic, 1, future))

    async def _send(self, topic: str, partition: int, batch) -> None:
        await self._known(topic, partition)
        n = batch.record_count()
        future = await self.in_transaction(self.producer.send_batch(batch, topic, partition=partition))
        self.sent.append((topic, n, future))

    async def in_transaction(self, step: Awaitable[T]) -> T:
        """What ``step`` (a send, or the offsets' send) gives; a transaction lost under it, as its cause.

        aiokafka's sender adds a batch's partition to the transaction in the background. If the broker refuses
        that (a fence: another producer took the transactional id), the sender fails every batch it holds with
        the cause (``ProducerFenced``) and leaves the transaction, and the next ``send`` raises
        ``IllegalOperation`` ("not in transaction"), which is no Kafka error: the engine would take it for a bug of
        its own and stop the worker. Raised here instead: the cause a batch sent before failed with, else a
        :class:`TransactionLost` (a Kafka error: the partition is dropped and owned again)."""
        try:
            return await step
        except IllegalOperation as exc:
            futures = [f for _, _, f in self.sent]
            for future in futures:
                future.add_done_callback(retrieved)
            if futures:  # what aiokafka hands back is a shield of the batch's future: it fails a turn of the loop later
                await asyncio.wait(futures, timeout=_SETTLE_S, return_when=asyncio.FIRST_EXCEPTION)
            causes = [f.exception() for f in futures if f.done() and not f.cancelled()]
            cause = next((c for c in causes if c is not None), None)
            if cause is not None:  # a copy: the one the sender failed its batches with is shared by them
                raise copy.copy(cause) from exc
            raise TransactionLost(f"the producer's transaction ended under this batch ({exc})") from exc

    async def _known(self, topic: str, partition: int) -> None:
        """Refuse a partition the producer's metadata does not have, as a Kafka error the engine recovers from.

        An output deleted and auto-created with fewer partitions, seen by a producer owned after the router
        learned the old count: aiokafka's ``send`` would fail an ``assert`` there, which the engine takes for
        a bug of its own and stops on; this way the transaction aborts and the layout guard holds the
        partitions (loopwarden.engine.layoutguard). One look-up per batch, not per record."""
        if partition not in await self.producer.partitions_for(topic):
            raise UnknownTopicOrPartitionError(
                f"{topic} has no partition {partition} in this producer's metadata "
                f"(re-created with fewer partitions?)")

    async def flush(self) -> None:
        for (topic, partition), batch in self.open.items():
            if batch.record_count():
                await self._send(topic, partition, batch)
        self.open.clear()

    async def delivered(self) -> list[tuple[str, int, object]]:
        """Wait for every batch's ack; (topic, records, RecordMetadata of its first record).

        Each future awaited in turn, not gathered: one Produce reply settles them all, and ``gather`` would add a
        turn of the event loop to the commit (bench/HISTORY.md, "A commit step by step"). On the first error the others'
        are retrieved too, as ``gather`` does, so none is logged as never retrieved."""
        metas = []
        try:
            for topic, n, future in self.sent:
                metas.append((topic, n, await future))
        except BaseException:
            for _, _, future in self.sent:
                future.add_done_callback(retrieved)
            raise
        return metas


def retrieved(future: asyncio.Future) -> None:
    """A done callback that reads the future's error, so that asyncio does not log it as never retrieved."""
    if not future.cancelled():
        future.exception()
