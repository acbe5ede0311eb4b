"""Adding partitions the supported way: every co-partitioned topic grows together, and runs move.

A run lives on partition ``murmur2(run id) % N`` of the inputs and of the changelog. Growing
the topics to M partitions moves about ``1 - N/M`` of the runs in flight to another
partition: their state must follow, and so must the events of theirs that wait, not yet
consumed, on the old partition. :func:`expand` does all of it while no worker runs (the
group must be empty), in one Kafka transaction after the topics have grown:

1. grow the co-partitioned topics (steps, outcomes, the verified outcomes when set, ticks, changelog) to M
   partitions (a topic already at M, from an earlier attempt that stopped halfway, is left as it is);
2. for each old partition p: read its changelog (``read_committed``) and move every run state
   whose new partition q differs: the state to changelog q, a tombstone to p;
3. copy the events not consumed yet of moved runs (from the group's committed offset to the
   end, on the input topics) to their new partition, in offset order; the old partition's
   ``boundary`` offsets are recorded so the worker skips those copies' originals;
4. write the layout record (meta key ``\\xffloopwarden/layout``) to every changelog partition:
   the previous and the new count and, per old partition, the boundary.

After it, workers start with ``LOOPWARDEN_PARTITIONS=M``. A producer that has not refreshed its
metadata yet (up to ``metadata.max.age.ms``, 5 minutes by default) still hashes over N: the
worker recognises such records from the layout record (they hash to their partition over N, not
over M) and forwards them to the right partition in its own transaction; any other record whose
key does not hash to its partition is dead-lettered ``wrong_partition``. Nothing is folded on a
partition it does not belong to, and nothing is dropped.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field

import msgspec
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewPartitions
from aiokafka.errors import KafkaError

from loopwarden.engine.assignment import partition_of
from loopwarden.stages.health.batch import CLOCK_KEY
from loopwarden.stages.health.config import HealthConfig
from loopwarden.engine.exceptions import TopicLayoutError
from loopwarden.engine.recovery import decode_offsets
from loopwarden.engine.security import client_options
from loopwarden.engine.store import OFFSETS_KEY
from loopwarden.stages.topics import co_partitioned, existing_counts, inputs
from loopwarden.stages.health.topology import (
    LAYOUT_KEY,
    Expansion,
    decode_expansion,
    encode_expansion,
)

log = logging.getLogger("loopwarden.expand")

@dataclass
class Report:
    """What an expansion did."""

    previous: int
    partitions: int
    grown: list[str] = field(default_factory=list)
    runs_moved: int = 0
    runs_kept: int = 0
    events_copied: int = 0

    def __str__(self) -> str:
        grown = ", ".join(self.grown) or "none (already grown)"
        return (f"expanded {self.previous} -> {self.partitions} partitions (grown: {grown}); "
                f"{self.runs_moved} runs moved, {self.runs_kept} stayed; {self.events_copied} waiting events "
                f"copied to their new partition. Start the workers with LOOPWARDEN_PARTITIONS={self.partitions}.")


def moved(key: bytes | None, old: int, new: int, partition: int) -> int | None:
    """The new partition of a record on ``partition`` with ``key``, or None if it stays there."""
    if not key or key[:1] == b"\xff":
        return None
    target = partition_of(key, new)
    return None if target == partition else target


async def expand(config: HealthConfig, partitions: int, *, timeout_s: float = 60.0) -> Report:
    """Grow the co-partitioned topics of ``config`` to ``partitions`` and move runs; see the module doc."""
    c = config
    topics = co_partitioned(c)
    admin = AIOKafkaAdminClient(**client_options(c), request_timeout_ms=int(timeout_s * 1000))
    await admin.start()
    try:
        counts = await existing_counts(admin, topics)
        missing = [t for t in topics if t not in counts]
        if missing:
            raise TopicLayoutError(f"cannot expand: {', '.join(missing)} missing (start a worker once to create them)")
        # The count before the expansion: the smallest (a topic grown out of band, or by an earlier attempt
        # that stopped halfway, already has the new one).
        old = min(counts.values())
        if all(n == partitions for n in counts.values()):
            raise TopicLayoutError(f"cannot expand: the topics already have {partitions} partitions")
        if partitions <= old:
            raise TopicLayoutError(f"cannot expand to {partitions}: {c.steps_topic} has {counts[c.steps_topic]}; "
                                   "Kafka can add partitions, never remove them")
        bad = {t: n for t, n in counts.items() if n not in (old, partitions)}
        if bad:
            raise TopicLayoutError(f"cannot expand: partition counts {bad} are neither {old} nor {partitions}")
        await _refuse_live_group(admin, c.app_id)
        report = Report(previous=old, partitions=partitions)
        grow = {t: NewPartitions(partitions) for t, n in counts.items() if n < partitions}
        if grow:
            await admin.create_partitions(grow)
            report.grown = sorted(grow)
        await _wait_for_layout(admin, topics, partitions)
    finally:
        await admin.close()
    await _move(c, old, partitions, report)
    log.info("%s", report)
    return report


async def _refuse_live_group(admin: AIOKafkaAdminClient, group: str) -> None:
    for attempt in range(60):
        try:
            answers = await admin.describe_consumer_groups([group])
            break
        except KafkaError as exc:  # a fresh cluster elects its group coordinator first
            if not exc.retriable or attempt == 59:
                raise
            await asyncio.sleep(0.5)
    for described in answers:
        for g in described.to_object()["groups"]:
            members = g.get("members") or []
            if members:
                raise TopicLayoutError(
                    f"cannot expand while the group {group!r} has {len(members)} active member(s): "
                    "stop every worker first (their runs move with the expansion)")


async def _wait_for_layout(admin: AIOKafkaAdminClient, topics: list[str], partitions: int) -> None:
    for _ in range(300):
        counts = await existing_counts(admin, topics)
        if all(counts.get(t) == partitions for t in topics):
            return
        await asyncio.sleep(0.1)
    raise TopicLayoutError(f"the topics did not reach {partitions} partitions within 30 s: {counts}")


async def _move(c: HealthConfig, old: int, new: int, report: Report) -> None:
    """Read old changelog partitions and waiting events; write moves, copies and layout records in one transaction."""
    reader = AIOKafkaConsumer(**client_options(c), group_id=None, enable_auto_commit=False,
                              isolation_level="read_committed", auto_offset_reset="earliest")
    group = AIOKafkaConsumer(**client_options(c), group_id=c.app_id, enable_auto_commit=False)
    producer = AIOKafkaProducer(**client_options(c), transactional_id=f"{c.app_id}-expand",
                                enable_idempotence=True, acks="all", max_request_size=c.max_message_bytes + 8192)
    await reader.start()
    await group.start()
    await producer.start()
    try:
        changelog = {p: await _read_all(reader, TopicPartition(c.changelog_topic, p)) for p in range(old)}
        existing = changelog.get(0, {}).get(LAYOUT_KEY)
        layout = decode_expansion(existing) if existing else None
        boundaries: dict[int, dict[str, int]] = {}
        copies: list[tuple[str, int, object]] = []
        for p in range(old):
            if layout is not None and layout.partitions == new:
                break  # an earlier attempt copied the waiting events already (its layout record says so)
            boundaries[p] = {}
            for topic in inputs(c):
                tp = TopicPartition(topic, p)
                start = await group.committed(tp)
                logged = decode_offsets(changelog[p].get(OFFSETS_KEY)).get(topic)  # the worker's last transaction
                if logged is not None and (start is None or logged > start):
                    start = logged
                records, end = await _read_range(reader, tp, start)
                boundaries[p][topic] = end
                for r in records:
                    target = moved(r.key, old, new, p)
                    if target is not None:
                        copies.append((topic, target, r))
        await producer.begin_transaction()
        # New partitions start at the latest event-time clock of the old ones (LOOPWARDEN_CLOCK=event).
        clocks = [msgspec.msgpack.decode(s[CLOCK_KEY], type=int) for s in changelog.values() if CLOCK_KEY in s]
        clock = msgspec.msgpack.encode(max(clocks)) if clocks else None
        for p, states in changelog.items():
            for key, value in states.items():
                target = moved(key, old, new, p)
                if key[:1] == b"\xff":
                    continue
                if target is None:
                    report.runs_kept += 1
                    continue
                await producer.send(c.changelog_topic, value, key=key, partition=target)
                await producer.send(c.changelog_topic, None, key=key, partition=p)
                report.runs_moved += 1
        for topic, target, r in copies:
            await producer.send(topic, r.value, key=r.key, partition=target, headers=list(r.headers or ()))
            report.events_copied += 1
        at_ms = int(time.time() * 1000)
        for p in range(new):
            was = layout.boundary if layout is not None and layout.partitions == new and p < old else {}
            record = Expansion(partitions=new, previous=old, boundary=boundaries.get(p, was) if p < old else {},
                               at_ms=at_ms)
            await producer.send(c.changelog_topic, encode_expansion(record), key=LAYOUT_KEY, partition=p)
            if p >= old and clock is not None:
                await producer.send(c.changelog_topic, clock, key=CLOCK_KEY, partition=p)
        await producer.commit_transaction()
    finally:
        await producer.stop()
        await group.stop()
        await reader.stop()


async def _read_all(reader: AIOKafkaConsumer, tp: TopicPartition) -> dict[bytes, bytes]:
    """The latest value per key of a changelog partition (tombstones remove)."""
    records, _end = await _read_range(reader, tp, None)
    out: dict[bytes, bytes] = {}
    for r in records:
        if r.key is None:
            continue
        if r.value is None:
            out.pop(r.key, None)
        else:
            out[r.key] = r.value
    return out


async def _read_range(reader: AIOKafkaConsumer, tp: TopicPartition, start: int | None) -> tuple[list, int]:
    """Committed records of ``tp`` from ``start`` (None: the beginning) to its end; and that end offset."""
    reader.assign([tp])
    end = (await reader.end_offsets([tp]))[tp]
    if start is None:
        start = (await reader.beginning_offsets([tp]))[tp]
    out: list = []
    if start < end:
        reader.seek(tp, start)
        while await reader.position(tp) < end:
            batch = await reader.getmany(tp, timeout_ms=1000, max_records=10_000)
            out += [r for r in batch.get(tp, ()) if r.offset < end]
    reader.assign([])
    return out, end
