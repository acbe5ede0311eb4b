"""The engine's input-offsets record: kept by a store beside its position, out of the stage's view, decoded safely,
with the marks that tell a topic created again (marks.py)."""

from __future__ import annotations

import zlib
from collections import namedtuple
from pathlib import Path

import msgspec
import pytest

from loopwarden.engine.marks import marks_of
from loopwarden.engine.recovery import decode_logged, decode_offsets, encode_offsets
from loopwarden.engine.store import OFFSETS_KEY, MemoryPartition, RocksPartition


def _stores(tmp_path: Path):
    return [MemoryPartition(), RocksPartition(tmp_path / "rocks-0")]


@pytest.mark.parametrize("kind", ["memory", "rocksdb"])
def test_a_store_keeps_the_offsets_record_out_of_the_stages_view(tmp_path: Path, kind: str) -> None:
    """Written with the changes, the record is the store's ``offsets``; get, iteration and items never show it."""
    store = _stores(tmp_path)[0 if kind == "memory" else 1]
    raw = encode_offsets({"agent.steps": 41, "agent.outcomes": 7})
    store.write({b"run-1": b"state"}, 12, raw)
    assert store.offsets == raw and store.position == 12
    assert dict(store.items()) == {b"run-1": b"state"} and list(store) == [b"run-1"] and len(store) == 1
    assert store.get(OFFSETS_KEY) is None and OFFSETS_KEY not in store
    store.write({b"run-2": b"s2"}, 13)  # a write without a record keeps the last one
    assert store.offsets == raw
    store.wipe()
    assert store.offsets is None and store.position == 0
    store.close()


def test_a_rocksdb_store_has_its_offsets_record_after_a_restart(tmp_path: Path) -> None:
    """The record is written in the same atomic batch as the states and the position, and read back on open."""
    store = RocksPartition(tmp_path / "rocks-1")
    raw = encode_offsets({"agent.steps": 99})
    store.write({b"run-1": b"state"}, 5, raw)
    store.close()
    again = RocksPartition(tmp_path / "rocks-1")
    assert again.offsets == raw and again.position == 5 and decode_offsets(again.offsets) == {"agent.steps": 99}
    again.close()


def test_an_offsets_record_that_is_not_one_decodes_to_nothing() -> None:
    """None and bytes of another shape give {} (the group's committed offsets decide), never an exception."""
    assert decode_offsets(None) == {}
    assert decode_offsets(b"\x05") == {}
    assert decode_offsets(encode_offsets({"t": 3})) == {"t": 3}
    assert decode_offsets(b"\x81\xa1t\xa1x") == {}  # {"t": "x"}: not an offset


def test_an_offsets_record_carries_the_marks_and_reads_the_older_shape() -> None:
    """With marks a topic's entry is [next, mark offset, timestamp, key CRC]; a topic without a mark, and a record
    written before marks, hold the next offset alone; decode_offsets gives the offsets of either shape."""
    raw = encode_offsets({"steps": 41, "outcomes": 7}, {"steps": (40, 1_700_000_000_123, 99)})
    assert msgspec.msgpack.decode(raw) == {"steps": [41, 40, 1_700_000_000_123, 99], "outcomes": 7}
    assert decode_logged(raw) == {"steps": (41, (40, 1_700_000_000_123, 99)), "outcomes": (7, None)}
    assert decode_offsets(raw) == {"steps": 41, "outcomes": 7}
    older = msgspec.msgpack.encode({"steps": 41})
    assert encode_offsets({"steps": 41}) == older and decode_logged(older) == {"steps": (41, None)}
    assert decode_logged(msgspec.msgpack.encode({"steps": [41, 40]})) == {}  # neither shape: the group's decide


def test_marks_of_takes_each_topics_last_record_below_its_next_offset() -> None:
    """From the batch's end: the last record of each topic consumed (offset below the next one); a topic whose
    records in the batch all wait beyond it (held by stream-time alignment) gets none, and keeps its earlier mark."""
    R = namedtuple("R", "topic offset timestamp key")
    records = [R("steps", 10, 1000, b"a"), R("outcomes", 3, 1001, b"b"), R("steps", 11, 1002, b"c"),
               R("outcomes", 4, 1003, None), R("steps", 12, 1004, b"d")]
    assert marks_of(records, {"steps": 12, "outcomes": 5}) == {
        "steps": (11, 1002, zlib.crc32(b"c")), "outcomes": (4, 1003, 0)}
    assert marks_of(records, {"steps": 13, "outcomes": 4}) == {"steps": (12, 1004, zlib.crc32(b"d")),
                                                              "outcomes": (3, 1001, zlib.crc32(b"b"))}
    assert marks_of(records, {"steps": 10, "ticks": 9}) == {}  # all held, and a topic without records here
