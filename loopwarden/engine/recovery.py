"""Owning a partition: fence earlier producers, restore the store from the changelog, resume at the committed offsets.

**Fencing.** Each input partition *i* has its own transactional id, ``<app id>-<i>``
(Kafka Streams' first exactly-once scheme, and Faust's): a worker assigned partition
*i* starts a producer with that id, which fences every earlier producer of it and
waits until their open transaction is committed or aborted. A worker that lost
partition *i* (paused past its session, then resumed) can never commit output, state
or offsets for it again. aiokafka's ``send_offsets_to_transaction`` takes a group id
only, not the consumer's group metadata, so KIP-447 (one producer per worker, fenced
by generation) is not available; hence one producer per partition.

**Restore.** Once the producer is up the changelog and the committed offsets are
final (they were written in the same transactions): the store reads its changelog
partition ``read_committed`` from its position to the end, then the inputs seek to the
group's committed offsets, or further: to the input offsets of the changelog's last
engine record (``store.OFFSETS_KEY``, written by every transaction), since the group's
only trail it (the consumer commits them after the transactions, every ``commit_offsets_ms``:
:mod:`loopwarden.engine.groupcommit`); an input topic deleted and created again since (its
record's mark is not there: :mod:`loopwarden.engine.marks`) is read from its beginning. Nothing else.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

import msgspec
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from loopwarden.engine.config import EngineConfig
from loopwarden.engine.outputs import OVERHEAD
from loopwarden.engine.marks import Mark, describe, recreated
from loopwarden.engine.security import client_options
from loopwarden.engine.store import OFFSETS_KEY, PartitionStore

log = logging.getLogger("loopwarden.worker")
_encode_offsets = msgspec.msgpack.Encoder().encode
# topic -> next offset, or [next offset, the mark's offset, timestamp, key CRC] (marks.py; a record written
# without marks holds the offset alone)
_decode_offsets = msgspec.msgpack.Decoder(dict[str, int | tuple[int, int, int, int]]).decode
# A changelog's topic configs: compaction keeps each key's last state, a tombstone goes after a day.
COMPACTED = {"cleanup.policy": "compact", "delete.retention.ms": "86400000"}


def encode_offsets(offsets: dict[str, int], marks: Mapping[str, Mark] | None = None) -> bytes:
    """The value of the changelog's engine record: input topic -> next offset to consume, with the mark of a
    record consumed before it where ``marks`` has one."""
    if not marks:
        return _encode_offsets(offsets)
    return _encode_offsets({t: (n, *marks[t]) if t in marks else n for t, n in offsets.items()})


def decode_logged(raw: bytes | None) -> dict[str, tuple[int, Mark | None]]:
    """``encode_offsets``'s map as topic -> (next offset, mark or None); {} for none or for a value that is not
    one (logged: the group's offsets decide)."""
    if raw is None:
        return {}
    try:
        logged = _decode_offsets(raw)
    except msgspec.DecodeError:
        log.warning("the changelog's input-offsets record is not one (%d bytes): using the group's offsets", len(raw))
        return {}
    return {t: (v, None) if v.__class__ is int else (v[0], v[1:]) for t, v in logged.items()}  # type: ignore[index]


def decode_offsets(raw: bytes | None) -> dict[str, int]:
    """``encode_offsets``'s map, input topic -> next offset (``decode_logged`` without the marks)."""
    return {t: n for t, (n, _mark) in decode_logged(raw).items()}


def restoring_consumer(config: EngineConfig) -> AIOKafkaConsumer:
    """A consumer of no group that reads changelogs ``read_committed`` (:func:`restore`), not started."""
    return AIOKafkaConsumer(**client_options(config), group_id=None, enable_auto_commit=False,
                            isolation_level="read_committed", auto_offset_reset="earliest")


def transactional_producer(config: EngineConfig, partition: int) -> AIOKafkaProducer:
    """The producer of one input partition's transactions (``<app id>-<partition>``), not started."""
    return AIOKafkaProducer(
        **client_options(config), transactional_id=f"{config.app_id}-{partition}", enable_idempotence=True,
        acks="all", max_request_size=config.max_message_bytes + OVERHEAD * 2, linger_ms=0,
        max_batch_size=256 * 1024, request_timeout_ms=30_000,
        # A transaction begun right after the last one commits meets CONCURRENT_TRANSACTIONS
        # while the markers are written: retry that in ms, not the default 100 ms.
        retry_backoff_ms=10,
    )


async def restore(restorer: AIOKafkaConsumer, changelog_topic: str, stores: dict[int, PartitionStore]) -> int:
    """Read the changelog partitions (committed records only) from each store's position to the end; records read."""
    tps = {TopicPartition(changelog_topic, p): store for p, store in stores.items()}
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
                values = {r.key: r.value for r in records}
                offsets = values.pop(OFFSETS_KEY, None)  # the engine's, not the stage's: kept beside the position
                tps[tp].write(values, records[-1].offset + 1, offsets)
                n += len(records)
        for tp in list(todo):
            position = await restorer.position(tp)
            if position >= ends[tp]:
                tps[tp].write({}, position)
                restorer.pause(tp)
                del todo[tp]
    restorer.assign([])
    if n:
        log.info("restored %d changelog records for partitions %s", n, sorted(stores))
    return n


async def seek_committed(consumer: AIOKafkaConsumer, topics: tuple[str, ...], partitions: list[int],
                         stores: dict[int, PartitionStore] | None = None, behind: set[int] | None = None,
                         reader: AIOKafkaConsumer | None = None
                         ) -> tuple[dict[int, dict[str, int]], dict[int, dict[str, Mark]]]:
    """Seek each input partition to where its last committed transaction stopped; partition -> topic -> offset,
    and partition -> topic -> the mark carried on.

    That is the group's committed offset (the beginning if none), or the offsets the changelog's last
    engine record holds when they are further (the group's follow the transactions every
    ``commit_offsets_ms``; the changelog has them in every transaction). The partitions where the
    changelog's are further are added to ``behind``: the group's must catch up even if nothing more comes.
    Resuming at the record's offset, its mark is looked up first with ``reader`` (``marks.py``): a topic
    deleted and created again since is read from its beginning."""
    tps = [TopicPartition(topic, p) for p in partitions for topic in topics]
    committed = {tp: await consumer.committed(tp) for tp in tps}
    missing = [tp for tp, o in committed.items() if o is None]
    starts = await consumer.beginning_offsets(missing) if missing else {}
    logged = {p: decode_logged(stores[p].offsets) if stores else {} for p in partitions}
    offsets: dict[int, dict[str, int]] = {p: {} for p in partitions}
    marks: dict[int, dict[str, Mark]] = {p: {} for p in partitions}
    for tp in tps:
        offset = committed[tp] if committed[tp] is not None else starts[tp]
        at, mark = logged[tp.partition].get(tp.topic, (-1, None))
        if at > offset:
            offset = at
            if behind is not None:
                behind.add(tp.partition)
        if mark is not None and at == offset:
            marks[tp.partition][tp.topic] = mark
        offsets[tp.partition][tp.topic] = offset
    checked = {TopicPartition(t, p): m for p, by_topic in marks.items() for t, m in by_topic.items()}
    for tp, (begin, found) in (await recreated(reader, checked) if reader is not None else {}).items():
        log.warning(describe(tp, checked[tp], offsets[tp.partition][tp.topic], begin, found))
        offsets[tp.partition][tp.topic] = begin
        del marks[tp.partition][tp.topic]
    for tp in tps:  # no await among the seeks: all or none
        offset = offsets[tp.partition][tp.topic]
        log.debug("%s[%d]: resuming at %d (the group's committed offset %s, the changelog's record %s)", tp.topic,
                  tp.partition, offset, committed[tp], logged[tp.partition].get(tp.topic))
        consumer.seek(tp, offset)
    return offsets, marks


async def seek_since(consumer: AIOKafkaConsumer, partitions, since_ms: int) -> None:
    """For readers that keep no offsets (the board, the verifiers): seek each of ``partitions`` to its first
    record stamped at or after ``since_ms``, or, with none, to the end offset it had *before* that look-up.

    Explicit offsets, so that no record published meanwhile is skipped: ``seek_to_end`` resolves the end
    with a request of its own, and a record published between the look-up and its answer would never be
    read (a verifier's runs would go FALSE_COMPLETE with their expectations never checked:
    tests/integration/test_verify_kafka.py). A record that lands
    between the two look-ups is found by the second; one after both is at or after the end taken first."""
    partitions = list(partitions)
    if not partitions:
        return
    ends = await consumer.end_offsets(partitions)
    found = await consumer.offsets_for_times({tp: since_ms for tp in partitions})
    for tp in partitions:
        at = found.get(tp)
        consumer.seek(tp, ends[tp] if at is None else at.offset)
