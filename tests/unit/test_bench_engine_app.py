"""bench/peers/engine_app.py: the peers' job (a count per run, one output per input) as a stage on the engine."""

from __future__ import annotations

import json

import msgspec
from aiokafka.structs import ConsumerRecord

from bench.peers.engine_app import CountStage, CountTask


def _rec(topic: str, offset: int, key: bytes, value: bytes) -> ConsumerRecord:
    return ConsumerRecord(topic, 3, offset, 0, 0, key, value, None, len(key), len(value), [])


def test_counts_per_run_from_the_store_and_within_the_batch(tmp_path, monkeypatch):
    """Each input gives one output {type, n} keyed by its run; n goes on from the committed count and
    from earlier records of the same batch; the changelog holds each run's last count; offsets per topic."""
    monkeypatch.setenv("PEER_READY_FILE", str(tmp_path / "ready.json"))
    stage = CountStage("steps", "outcomes", "out", "app")
    task = stage.task(3, {b"r1": b"4"})
    records = [_rec("steps", 10, b"r1", b'{"type":"step_finished","run_id":"r1"}'),
               _rec("outcomes", 7, b"r2", b'{"type":"outcome_receipt","run_id":"r2"}'),
               _rec("steps", 11, b"r1", b'{"type":"run_ended","run_id":"r1"}')]
    out = task.fold(records, punctuate=False, caught_up=True, lagging=())
    assert [(o.topic, o.key, msgspec.json.decode(o.value)) for o in out.outputs] == [
        ("out", b"r1", {"type": "step_finished", "n": 5}),
        ("out", b"r2", {"type": "outcome_receipt", "n": 1}),
        ("out", b"r1", {"type": "run_ended", "n": 6})]
    assert out.changes == {b"r1": b"6", b"r2": b"1"}
    assert out.offsets == {"steps": 12, "outcomes": 8}
    assert out.consumed == 3 and not out.deadletters
    assert set(json.loads((tmp_path / "ready.json").read_text())) == {"t", "cpu"}  # marked at the first record
    assert stage.keyed_like_input == {"out"} and [i.role for i in stage.inputs] == ["steps", "outcomes"]


def test_a_value_that_is_not_a_json_object_with_a_type_is_dead_lettered(tmp_path, monkeypatch):
    """Not JSON, JSON without "type", JSON that is not an object: dead letters naming why; nothing counted,
    their offsets still consumed."""
    monkeypatch.setenv("PEER_READY_FILE", str(tmp_path / "ready.json"))
    task = CountTask({}, "out", CountStage("s", "o", "out", "app").progress)
    out = task.fold([_rec("s", 0, b"r", b"{not json"), _rec("s", 1, b"r", b'{"run_id":"r"}'),
                     _rec("s", 2, b"r", b"[1]")], punctuate=False, caught_up=True, lagging=())
    assert [d.reason for d in out.deadletters] == ["undecodable"] * 3
    assert "type" in out.deadletters[1].error
    assert not out.outputs and not out.changes and out.offsets == {"s": 3}
