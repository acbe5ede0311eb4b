"""After an expansion, the engine's half of settling (:mod:`loopwarden.stages.health.settle`): how far the old
partitions a task waits for were forwarded, read with a consumer of its own (no group) and the group's."""

from __future__ import annotations

import asyncio
import logging
import time

from aiokafka import AIOKafkaConsumer, TopicPartition

from loopwarden.engine.config import EngineConfig
from loopwarden.engine.manager import RECOVERABLE, PartitionManager, quietly
from loopwarden.engine.security import client_options
from loopwarden.engine.stage import Horizon, Settles

log = logging.getLogger("loopwarden.worker")


class Horizons:
    """The engine's half: reads :class:`Horizon` s with a consumer of its own (no group) and the group's consumer."""

    def __init__(self, config: EngineConfig, partitions: PartitionManager) -> None:
        self.config = config
        self.partitions = partitions  # its group's consumer (committed offsets), its tracked input topics
        self.probe: AIOKafkaConsumer | None = None  # read_committed, no group: end offsets, the first record not consumed
        # read_uncommitted, no group: an old partition's high watermark. Its last stable offset would hide a producer's
        # record appended while another partition's forwarding transaction to it is open (old partitions are new
        # partitions' targets too): the partition would read as forwarded with that record still on it.
        self.tip: AIOKafkaConsumer | None = None
        self.lock = asyncio.Lock()  # partitions' pipelines share the probe
        self.started = False

    async def before_fold(self, part, assigned, records: list) -> None:
        """A task that settles moved runs after an expansion (its ``settling`` hook, :class:`~loopwarden.engine.stage.Settles`)
        learns how far the old partitions it waits for were forwarded."""
        settling = part.task.settling
        if settling is None or not settling.needed:
            return
        try:
            in_hand = dict(assigned.committed) if assigned is not None and not part.task.holding else None
            if in_hand is not None:  # earlier folds' are committed (a fold waits for its previous commit)
                for r in records:  # and this fold's are here
                    if r.offset >= in_hand.get(r.topic, 0):
                        in_hand[r.topic] = r.offset + 1
            await self.settle(part.number, settling, in_hand)
        except RECOVERABLE as exc:  # the records wait for the next fold
            log.warning("partition %d: reading how far moved runs were forwarded failed (%s: %s)",
                        part.number, type(exc).__name__, exc)

    async def stop(self) -> None:
        if self.started:
            for consumer in (self.probe, self.tip):
                await quietly(consumer.stop(), "stopping a consumer", " during shutdown")  # type: ignore[union-attr]

    async def settle(self, partition: int, s: Settles, in_hand: dict[str, int] | None) -> None:
        """Before a fold: read a horizon for the old partitions ``s`` waits for; make it the task's once the
        records forwarded before it are in hand. ``in_hand``: input topic -> the offset up to which the fold
        has every record (committed, or among its records); None: it may not fold them all (some are held)."""
        if not s.needed:
            return
        if s.pending is None or not s.needed <= s.pending.first.keys():
            s.pending = await self.read(partition, s.needed)
            if s.pending is None:  # not readable now: the horizon the task has stays, the next fold reads again
                return
        if in_hand is not None and all(in_hand.get(t, 0) >= need for t, need in s.pending.need.items()):
            s.horizon, s.pending = s.pending, None

    async def read(self, partition: int, old: set[int]) -> Horizon | None:
        """How far the ``old`` partitions were forwarded, as a :class:`Horizon` for ``partition``; None while a
        transaction to ``partition`` begun before the reading is still open (see :meth:`_stable_ends`)."""
        async with self.lock:
            if self.probe is None:
                options = dict(client_options(self.config), group_id=None, enable_auto_commit=False)
                self.probe = AIOKafkaConsumer(**options, isolation_level="read_committed", auto_offset_reset="earliest")
                self.tip = AIOKafkaConsumer(**options, isolation_level="read_uncommitted")
            probe, tip, topics = self.probe, self.tip, tuple(self.partitions.tracked)
            if not self.started:  # started by the first reading (under the lock: pipelines run concurrently)
                await asyncio.gather(probe.start(), tip.start())  # type: ignore[union-attr]
                self.started = True
            read_ms = int(time.time() * 1000)
            tps = [TopicPartition(t, p) for p in sorted(old) for t in topics]
            ends = await tip.end_offsets(tps)  # type: ignore[union-attr]  # high watermarks: every record on them
            waiting: dict[int, list[int]] = {p: [] for p in old}  # old partition -> first timestamps not consumed
            for tp in tps:
                committed = await self.partitions.consumer.committed(tp) or 0
                if committed < ends[tp]:
                    ts = await self._first_ts(tp, committed, ends[tp])
                    if ts is not None:
                        waiting[tp.partition].append(ts)
            first = {p: (min(ts) if ts else None) for p, ts in waiting.items()}  # -1 (unreadable): never ready
            own = [TopicPartition(t, partition) for t in topics]
            stable = await self._stable_ends(own)
            if stable is None:
                return None
            need = {tp.topic: await self._records_end(tp, end) for tp, end in stable.items()}
            return Horizon(read_ms, first, need)

    async def _stable_ends(self, own: list[TopicPartition], tries: int = 5) -> dict | None:
        """The last stable offsets of this partition's input topics once they reach the high watermarks read
        first (None if they do not within ``tries`` readings): every record forwarded by a transaction whose
        offsets the group committed before is then decided, and below them.

        The broker answers EndTxn before it writes the transaction's markers, and the group's offsets are
        committed after EndTxn (:mod:`loopwarden.engine.groupcommit`): the old partition may read as forwarded
        while the forwarded record's transaction is still open here, above the last stable offset."""
        highs = await self.tip.end_offsets(own)  # type: ignore[union-attr]  # read after the group's offsets
        for attempt in range(tries):
            stable = await self.probe.end_offsets(own)  # type: ignore[union-attr]
            if all(stable[tp] >= highs[tp] for tp in own):
                return stable
            if attempt + 1 < tries:
                await asyncio.sleep(0.02)
        return None

    async def _records_end(self, tp: TopicPartition, end: int) -> int:
        """The offset after the last committed record below ``end`` (the last stable offset): a fold that has
        it has every record forwarded so far (the transaction markers after it are no records to wait for)."""
        probe, start = self.probe, max(0, end - 64)  # a forwarding transaction: its records, then one marker
        if end == 0:
            return 0
        probe.assign([tp])
        try:
            probe.seek(tp, start)
            last = None
            while await probe.position(tp) < end:
                records = (await probe.getmany(tp, timeout_ms=200, max_records=100)).get(tp) or []
                if not records and await probe.position(tp) < end:
                    return end  # could not be read now: wait for all of it
                last = next((r.offset for r in reversed(records) if r.offset < end), last)
            return start if last is None else last + 1
        finally:
            probe.assign([])

    async def _first_ts(self, tp: TopicPartition, offset: int, end: int) -> int | None:
        """The timestamp of the first committed record from ``offset`` to ``end``: None if there is none
        (only transaction markers: the partition was consumed to its end), -1 if it could not be read now."""
        probe = self.probe
        probe.assign([tp])
        try:
            probe.seek(tp, offset)
            for _ in range(5):
                records = (await probe.getmany(tp, timeout_ms=200, max_records=1)).get(tp) or []
                if records:
                    return records[0].timestamp if records[0].offset < end else None
                if await probe.position(tp) >= end:
                    return None
            return -1
        finally:
            probe.assign([])
