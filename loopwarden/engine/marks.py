"""Input marks: the record each input partition was last consumed up to, to tell a topic deleted and created again.

The changelog's engine record (``store.OFFSETS_KEY``) says, per input topic, the next offset to
consume. An input topic deleted and created again while the workers were stopped starts again at
offset 0; once its producers have written past that offset, resuming there would skip the new
topic's first records without a word (the group's offsets of a deleted topic go with it; the
changelog's stay). Kafka tells topics apart by their topic ids, which aiokafka's metadata requests
do not read.

So with the next offset the record also holds a **mark**: the offset, timestamp and a CRC-32 of the
key of one record consumed before it (the batch's last one, or an earlier batch's). When a worker
owns the partition again it reads the record at the mark's offset: in the same topic it is the same
record (a delete-policy topic only loses records from its head, by retention; a mark before the
log's start is not checked). Another record there, or none, means the topic is a new one, and the
partition is read from its beginning (logged as a warning naming both offsets). A compacted input
topic (the layout never makes one) could lose the marked record and be read again from its start.
"""

from __future__ import annotations

import logging
import time
import zlib
from collections.abc import Mapping

from aiokafka import AIOKafkaConsumer, TopicPartition

log = logging.getLogger("loopwarden.worker")

Mark = tuple[int, int, int]  # offset, timestamp (ms), CRC-32 of the key
CHECK_TIMEOUT_S = 10.0  # an open transaction at the mark can hold its read back: then the mark is taken as is


def _crc(key: bytes | None) -> int:
    return zlib.crc32(key) if key else 0


def marks_of(records: list, offsets: Mapping[str, int]) -> dict[str, Mark]:
    """topic -> the mark of the last record of ``records`` below the topic's next offset in ``offsets`` (a topic
    whose records here all wait beyond it has none: its earlier mark stays). From the batch's end: O(records
    waiting) per commit."""
    need = dict(offsets)
    found: dict[str, Mark] = {}
    for rec in reversed(records):
        upto = need.get(rec.topic)
        if upto is not None and rec.offset < upto:
            found[rec.topic] = (rec.offset, rec.timestamp, _crc(rec.key))
            del need[rec.topic]
            if not need:
                break
    return found


async def recreated(reader: AIOKafkaConsumer,
                    marks: Mapping[TopicPartition, Mark]) -> dict[TopicPartition, tuple[int, str]]:
    """Of ``marks`` (input partition -> the mark of its last committed transaction), those whose record is not
    there any more -> (the partition's beginning offset, what was found instead). ``reader``: a consumer of no
    group, ``read_committed``, assigned nothing (the engine's changelog restorer); left so."""
    if not marks:
        return {}
    tps = list(marks)
    begin, end = await reader.beginning_offsets(tps), await reader.end_offsets(tps)  # no assignment needed
    found: dict[TopicPartition, tuple[int, str]] = {}
    todo: dict[TopicPartition, Mark] = {}
    for tp, mark in marks.items():
        if mark[0] < begin[tp]:
            continue  # retention took it: nothing to compare (a new topic starts at 0)
        if mark[0] >= end[tp]:
            found[tp] = begin[tp], f"the partition ends at offset {end[tp]}"
        else:
            todo[tp] = mark
    if not todo:
        return found
    # Assigned and sought with no await between: a partition assigned without a position has aiokafka's fetcher
    # look its offset up, and a consumer stopped meanwhile can hang in that (seen in the test of this module).
    reader.assign(list(todo))
    for tp, mark in todo.items():
        reader.seek(tp, mark[0])
    try:
        deadline = time.monotonic() + CHECK_TIMEOUT_S
        while todo and time.monotonic() < deadline:
            batch = await reader.getmany(*todo, timeout_ms=500, max_records=len(todo))
            for tp, records in batch.items():
                if records and tp in todo:
                    offset, ts, crc = todo.pop(tp)
                    rec = records[0]
                    if (rec.offset, rec.timestamp, _crc(rec.key)) != (offset, ts, crc):
                        found[tp] = begin[tp], f"offset {rec.offset} holds a record of timestamp {rec.timestamp}"
                    reader.pause(tp)
            for tp in list(todo):
                if await reader.position(tp) >= end[tp]:  # only aborted records or markers from the mark on
                    found[tp] = begin[tp], f"no committed record from offset {todo.pop(tp)[0]} to its end {end[tp]}"
                    reader.pause(tp)
        for tp in todo:
            log.warning("%s[%d]: the record at offset %d (the last consumed) could not be read within %.0f s (an "
                        "open transaction?): resuming after it unchecked", tp.topic, tp.partition, todo[tp][0],
                        CHECK_TIMEOUT_S)
        return found
    finally:
        reader.assign([])


def describe(tp: TopicPartition, mark: Mark, resume: int, begin: int, found: str) -> str:
    """The warning: which partition, the mark, what is there instead, and where it is read from."""
    return (f"{tp.topic}[{tp.partition}]: the record consumed at offset {mark[0]} (timestamp {mark[1]}) is not there "
            f"({found}): the topic was deleted and created again; reading it from its beginning, offset {begin}, "
            f"not from {resume}")
