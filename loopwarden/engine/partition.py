"""What the engine keeps per partition: the assignment's view, and everything an owned partition has.

:class:`AssignedPartition` lives as long as the group assigns the partition to this
worker (its committed offsets, progress and stall state, when to retry owning it);
:class:`OwnedPartition` as long as this worker owns it (fenced earlier producers,
restored its store): its task, store, producer, buffered records, alignment, pipeline.
A partition whose transaction failed or was fenced stays assigned and is no longer
owned: dropping ownership is :meth:`OwnedPartition.close` and forgetting the object.

The three observer places — after a restore, after a commit (with the committed
changes), on drop — are :meth:`OwnedPartition.after_restore`, :meth:`after_commit`
and :meth:`close`; each calls the stage's observer of the same moment.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

from aiokafka import TopicPartition

from loopwarden.engine.alignment import Alignment
from loopwarden.engine.checkpoint import retrieved
from loopwarden.engine.marks import Mark, marks_of
from loopwarden.engine.recovery import encode_offsets
from loopwarden.engine.stage import Folded, Stage, Task, value_bytes
from loopwarden.engine.store import PartitionStore

if TYPE_CHECKING:
    from aiokafka import AIOKafkaProducer

    from loopwarden.engine.checkpoint import Committed

log = logging.getLogger("loopwarden.worker")


class AssignedPartition:
    """A partition the group assigned to this worker, owned or not (fenced, failed: retried at ``recover_at``)."""

    def __init__(self, number: int) -> None:
        self.number = number
        self.committed: dict[str, int] = {}  # input topic -> next offset, as committed
        self.progress_at = time.monotonic()  # when its committed offsets last moved (or it was assigned)
        self.stalled = False
        self.recover_at: float | None = None  # not owned: when to try again
        self.owned: OwnedPartition | None = None

    def progressed(self, offsets: dict[str, int], untracked: frozenset[str]) -> None:
        """A commit moved these offsets: progress unless only untracked inputs (ticks) moved."""
        moved = False
        committed = self.committed
        for topic, offset in offsets.items():
            moved |= topic not in untracked and offset != committed.get(topic)
            committed[topic] = offset
        if moved:
            self.progress_at = time.monotonic()


class Stopping:
    """Producers of dropped partitions still stopping (``OwnedPartition.close``): each kept referenced until it is
    done (the event loop holds tasks weakly), and counted on ``gauge`` (``loopwarden_producers_stopping``)."""

    def __init__(self, gauge=None) -> None:
        self.stops: set[asyncio.Future] = set()
        self.gauge = gauge

    def add(self, stop: asyncio.Future) -> None:
        self.stops.add(stop)
        if self.gauge is not None:
            self.gauge.inc()
        stop.add_done_callback(self._done)

    def _done(self, stop: asyncio.Future) -> None:
        retrieved(stop)
        self.stops.discard(stop)
        if self.gauge is not None:
            self.gauge.dec()


class OwnedPartition:
    """Everything an owned partition has: task, store, producer, buffered records, alignment, its pipeline."""

    def __init__(self, number: int, stage: Stage, task: Task, store: PartitionStore, producer: AIOKafkaProducer,
                 alignment: Alignment) -> None:
        self.number = number
        self.stage = stage
        self.task = task
        self.store = store
        self.producer = producer
        self.alignment = alignment
        self.buffered: list = []  # records consumed, not folded yet
        self.buffered_bytes = 0  # their values' bytes (the engine bounds them with what the task holds)
        self.buffered_topics: set[str] = set()  # the input topics of ``buffered``'s records (Alignment.lagging reads it)
        self.next_offsets: dict[str, int] = {}  # input topic -> the offset its next record must have (from the seek)
        self.marks: dict[str, Mark] = {}  # input topic -> a record consumed before its committed offset (marks.py)
        self._marks: dict[str, Mark] = {}  # with the batch in its transaction
        self.punctuate = False  # the next fold fires due timers
        self.punctuate_at = 0.0  # monotonic time from which the engine marks it to punctuate again
        self.committed_at = 0.0  # monotonic time of its last commit
        self.group_behind = False  # the group's committed offsets are behind its last commit (groupcommit.py)
        self.pipeline: asyncio.Task | None = None  # fold, then commit, while records wait
        self.begun: asyncio.Future | None = None  # the next transaction's begin_transaction(), under way (begin_next)

    def punctuate_if_due(self, now: float, every: float, phase: float) -> None:
        """Mark the next fold to fire due timers once per ``every`` seconds, ``phase`` seconds into the interval
        (the first time at once); the engine gives each partition its own phase (bench/HISTORY.md, "g latency")."""
        if now >= self.punctuate_at:
            self.punctuate = True
            self.punctuate_at = now - (now - phase) % every + every  # the phase's next instant

    def accept(self, topic: str, records: list) -> None:
        """Buffer fetched records, less any below the offset this partition resumed at or already took (folded
        already, or sought past): a second guard behind the engine's, which never hands it a batch got across
        its seek (engine module docs, "A batch across a seek"); dropping any is logged."""
        expect = self.next_offsets.get(topic)
        if expect is not None and records[0].offset < expect:
            log.warning("%s[%d]: records %d..%d handed again (this partition takes from %d on): not taken", topic,
                        self.number, records[0].offset, records[-1].offset, expect)
            records = [r for r in records if r.offset >= expect]
        if records:
            self.next_offsets[topic] = records[-1].offset + 1
            self.buffered += records
            self.buffered_bytes += value_bytes(records)
            self.buffered_topics.add(topic)

    def take(self) -> tuple[list, set[str], bool]:
        """The records buffered, their input topics and whether to punctuate, handed to the next fold."""
        records, topics, punctuate = self.buffered, self.buffered_topics, self.punctuate
        self.buffered, self.buffered_topics, self.punctuate, self.buffered_bytes = [], set(), False, 0
        return records, topics, punctuate

    def begin_next(self) -> None:
        """Begin the next transaction now, off the next batch's path: aiokafka's ``begin_transaction`` waits
        three turns of the event loop (it shields a coroutine), ~3 ms of a 17-20 ms commit at 15 kev/s
        (bench/HISTORY.md, "A commit step by step"). A transaction begun is the client's state only: nothing reaches
        the broker before the first record, so one begun and never used costs nothing."""
        self.begun = asyncio.ensure_future(self.producer.begin_transaction())

    def take_begun(self) -> asyncio.Future | None:
        """The transaction :meth:`begin_next` began, handed to the commit that uses it (None: none begun)."""
        begun, self.begun = self.begun, None
        return begun

    async def pass_markers(self, consumer, assigned: AssignedPartition, topics) -> bool:
        """With every record handed over committed and none waiting, move the committed offsets of ``topics`` up
        to the consumer's position: what lies between is control records only (transaction markers, records of
        aborted transactions), which a consumer never hands over. Without this the marker after a transactional
        producer's last write (the bridge writes agent.steps so) reads as a lag of 1 for ever, in the lag gauge
        and in the group's offsets, and the stall watch reports the idle partition stalled (Kafka Streams had the
        same, KAFKA-6607). The engine calls it under its lock (the partitions stay assigned); whether any moved."""
        if self.buffered or self.task.holding or (self.pipeline is not None and not self.pipeline.done()):
            return False
        moved = False
        for topic in topics:
            committed = assigned.committed.get(topic)
            if committed is None or self.next_offsets.get(topic) != committed:
                continue  # never committed, or records handed over are not (in a fold, held, or failed)
            position = await consumer.position(TopicPartition(topic, self.number))
            if position > committed:
                assigned.committed[topic] = self.next_offsets[topic] = position
                moved = True
        return moved

    def offsets_record(self, committed: dict[str, int], offsets: dict[str, int], records: list
                       ) -> tuple[bytes, dict[str, int]]:
        """The changelog's engine record of a batch that consumed ``records`` up to ``offsets`` (the other inputs
        at ``committed``): each input's next offset and mark; and those offsets."""
        merged = {**committed, **offsets}
        self._marks = {**self.marks, **marks_of(records, offsets)}
        return encode_offsets(merged, self._marks), merged

    # -- the observer places -------------------------------------------------------------
    def after_restore(self) -> None:
        """The store holds the changelog's committed state and the task was rebuilt from it
        (``PartitionManager.prepare``): the stage hears of it."""
        self.stage.restored(self.number, self.task)

    def after_commit(self, result: Folded, committed: Committed | None) -> None:
        """The batch's transaction committed (``None``: the batch had nothing to commit)."""
        if committed is not None:
            self.store.write(result.changes, committed.position, committed.offsets)
            if committed.offsets is not None:
                self.marks = self._marks
        self.stage.committed(self.number, self.task, result, self.task.committed(result))

    def after_abort(self, result: Folded) -> None:
        """The batch's transaction failed: the task forgets it (the store holds the committed state)."""
        self.task.discard()
        self.stage.aborted(self.number, self.task, result)

    async def close(self, stopping: Stopping, wait_s: float = 5.0) -> None:
        """Drop the partition: the stage hears of it, the producer stops, the store closes (RocksDB stays on disk).

        A producer whose sends wait for a partition that is gone (an output deleted) stops only once they are
        delivered (aiokafka cannot close one without: in a test it outlasted 60 s), asking for that topic's
        metadata meanwhile (a broker with auto.create.topics.enable creates it again). Its stop is never cut off
        half-way, which would leave its sender asking for good: after ``wait_s`` it goes on in the background,
        in ``stopping`` until done (``loopwarden_producers_stopping``)."""
        self.take()  # what it buffered is consumed again by its next owner
        begun = self.take_begun()
        if begun is not None:  # its producer stops below: the begin is of no use, and its outcome not news
            begun.cancel()
            begun.add_done_callback(retrieved)
        self.stage.dropped(self.number, self.task)
        stop = asyncio.ensure_future(self.producer.stop())
        stopping.add(stop)
        try:
            await asyncio.wait_for(asyncio.shield(stop), timeout=wait_s)
        except asyncio.TimeoutError:
            log.warning("partition %d: its producer is still stopping after %.0f s (sends wait for a partition that "
                        "is gone); it goes on stopping in the background", self.number, wait_s)
        except Exception:  # a fenced or disconnected producer: nothing of it is needed any more
            log.debug("stopping the producer of partition %d failed", self.number, exc_info=True)
        self.store.close()
