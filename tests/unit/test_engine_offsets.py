"""The engine's input-offsets record: kept by a store beside its position, out of the stage's view, and decoded safely."""

from __future__ import annotations

from pathlib import Path

import pytest

from loopwarden.streams.recovery import decode_offsets, encode_offsets
from loopwarden.streams.store import OFFSETS_KEY, MemoryPartition, RocksPartition


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
