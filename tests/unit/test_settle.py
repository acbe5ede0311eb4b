"""Moved runs' records settling on their new partition after an expansion (loopwarden.stages.health.settle), without Kafka."""

from __future__ import annotations

import asyncio
import json

from loopwarden.engine.assignment import partition_of
from loopwarden.stages.health.batch import HealthFolded
from loopwarden.stages.health.inputs import decode_input
from loopwarden.engine.horizons import Horizons
from loopwarden.engine.stage import Horizon
from loopwarden.stages.health.settle import FORWARDED, SETTLE_KEY, Held, Settling
from tests.builders import ended, started, step

NOW = 1_800_000_000_000


def _moved_run(q: int = 5) -> str:
    """A run id hashing to partition q of 6 and to another partition of 4."""
    return next(r for r in (f"run-{i}" for i in range(1000))
                if partition_of(r.encode(), 6) == q and partition_of(r.encode(), 4) != q)


def _item(event: dict, offset: int, timestamp: int, forwarded: bool = False):
    headers = ((FORWARDED, b"1"),) if forwarded else ()
    rec = Held("steps", 5, offset, timestamp, event["run_id"].encode(), json.dumps(event).encode(), headers)
    return decode_input(rec, "steps", 2**63, 0)


def _settling() -> Settling:
    return Settling(5, 6, 4, at_ms=NOW, settle_ms=1000, window_ms=600_000)


def test_a_moved_runs_direct_record_waits_for_its_old_partition_and_then_comes_after_the_forwarded_ones() -> None:
    """Direct records wait (kept in the store) until the horizon shows the old partition forwarded past them;
    forwarded records produced before them are applied at once, in event-time order, and the direct ones after."""
    s, run = _settling(), _moved_run()
    old = partition_of(run.encode(), 4)
    assert s.old_partition(run.encode()) == old
    direct = [_item(step(1, run=run, ts=NOW + 20), 0, NOW + 20), _item(ended("natural_finish", 2, run=run, ts=NOW + 30), 1, NOW + 30)]
    changes: dict = {}
    assert s.release(direct, NOW, changes) == [] and s.needed == {old}
    assert len(s.stash) == 2 and SETTLE_KEY in changes and changes[SETTLE_KEY] is not None
    forwarded = [_item(started(run=run, ts=NOW), 2, NOW + 50, forwarded=True),
                 _item(step(0, run=run, ts=NOW + 10), 3, NOW + 50, forwarded=True)]
    s.horizon = Horizon(read_ms=NOW + 500, first={old: None}, need={})  # not yet 1 s past the direct records
    changes = {}
    released = s.release(forwarded, NOW, changes)  # earlier in event time than the records kept: they go first
    assert [(e.__struct_config__.tag, getattr(e, "step", None)) for _r, e, _rec in released] == [
        ("run_started", None), ("step_finished", 0)]
    assert changes == {} and len(s.stash) == 2 and s.needed == {old}  # the stash as the store holds it
    s.horizon = Horizon(read_ms=NOW + 2000, first={old: None}, need={})
    changes = {}
    released = s.release([], NOW, changes)
    assert [(e.__struct_config__.tag, getattr(e, "step", None)) for _r, e, _rec in released] == [
        ("step_finished", 1), ("run_ended", None)]
    assert changes == {SETTLE_KEY: None} and s.stash == [] and s.needed == set()


def test_a_forwarded_record_that_arrives_behind_a_kept_one_still_comes_before_the_later_direct_ones() -> None:
    """The horizon lets the run's direct step 2 go but not its run_ended (stamped a few ms later); its forwarded
    step 1, produced before both, arrives behind them. Step 1 and step 2 go, in that order; the run_ended waits
    (found in a fault test on a loaded machine: step 2 went alone, and step 1 after it made a step gap)."""
    s, run = _settling(), _moved_run()
    old = partition_of(run.encode(), 4)
    direct = [_item(step(2, run=run, ts=NOW + 2), 0, NOW + 100), _item(ended("natural_finish", 3, run=run, ts=NOW + 3), 1, NOW + 106)]
    s.release(direct, NOW, {})
    forwarded = _item(step(1, run=run, ts=NOW + 1), 2, NOW + 90, forwarded=True)
    s.horizon = Horizon(read_ms=NOW + 1101, first={old: None}, need={})  # past step 2's timestamp + 1 s only
    released = s.release([forwarded], NOW, {})
    assert [e.step for _r, e, _rec in released] == [1, 2]
    assert [e.__struct_config__.tag for _r, e, _rec in s.stash] == ["run_ended"] and s.needed == {old}
    late = _item(step(4, run=run, ts=NOW + 4), 3, NOW + 95, forwarded=True)  # after the run_ended kept: waits
    assert s.release([late], NOW, {}) == [] and len(s.stash) == 2


def test_records_that_are_not_a_moved_runs_or_not_this_partitions_are_not_held() -> None:
    """A run that hashes here over both counts, or elsewhere over the new one (placement judges it), is not settled."""
    s = Settling(1, 6, 4, at_ms=NOW, settle_ms=1000, window_ms=600_000)
    same = next(r for r in (f"s-{i}" for i in range(1000)) if partition_of(r.encode(), 6) == partition_of(r.encode(), 4) == 1)
    other = next(r for r in (f"o-{i}" for i in range(1000)) if partition_of(r.encode(), 6) != 1)
    assert s.old_partition(same.encode()) is None and s.old_partition(other.encode()) is None


def test_a_failed_batch_gets_the_committed_stash_back_and_the_store_restores_it() -> None:
    """discard() returns to the stash as committed; restore() decodes it from the store's bytes."""
    s, run = _settling(), _moved_run()
    changes: dict = {}
    s.release([_item(step(1, run=run, ts=NOW), 0, NOW)], NOW, changes)
    committed = changes[SETTLE_KEY]
    s.release([_item(step(2, run=run, ts=NOW + 1), 1, NOW + 1)], NOW, {})
    s.discard()
    assert len(s.stash) == 1
    again = _settling()
    again.restore(committed, lambda h: decode_input(h, "steps", 2**63, 0))
    assert [e.step for _r, e, _rec in again.stash] == [1]


def test_after_the_window_everything_kept_is_applied() -> None:
    """Once the settling window is over, records kept are released whatever the horizon."""
    s, run = _settling(), _moved_run()
    s.release([_item(step(1, run=run, ts=NOW), 0, NOW)], NOW, {})
    assert not s.active(NOW + 600_000)
    changes: dict = {}
    assert len(s.release([], NOW + 600_000, changes)) == 1 and s.stash == [] and s.done
    assert changes == {SETTLE_KEY: None}


def test_records_that_would_not_fit_one_changelog_record_stop_waiting() -> None:
    """Past max_bytes the stash is not kept: its records are applied as they came (and the store's stash dropped)."""
    s, run = Settling(5, 6, 4, at_ms=NOW, settle_ms=1000, window_ms=600_000, max_bytes=600), _moved_run()
    changes: dict = {}
    assert s.release([_item(step(1, run=run, ts=NOW), 0, NOW)], NOW, changes) == [] and changes[SETTLE_KEY]
    many = [_item(step(i, run=run, ts=NOW + i), i, NOW + i) for i in range(2, 6)]
    changes = {}
    released = s.release(many, NOW, changes)
    assert [e.step for _r, e, _rec in released] == [1, 2, 3, 4, 5] and s.stash == [] and changes == {SETTLE_KEY: None}


def test_a_moved_runs_records_wait_while_alignment_holds_one_of_its_records_back() -> None:
    """The horizon may count a forwarded record as in hand because it was in the batch, but stream-time alignment
    held it back for a later fold: the run's direct records wait with it, so they still come after it."""
    s, run = _settling(), _moved_run()
    old = partition_of(run.encode(), 4)
    direct = [_item(step(2, run=run, ts=NOW + 20), 0, NOW + 20), _item(ended("natural_finish", 3, run=run, ts=NOW + 30), 1, NOW + 30)]
    s.release(direct, NOW, {})
    s.horizon = Horizon(read_ms=NOW + 5000, first={old: None}, need={})  # the old partition: forwarded past them
    forwarded = _item(step(1, run=run, ts=NOW + 10), 2, NOW + 10, forwarded=True)
    held = {"steps": [(forwarded[2], forwarded)]}  # what StreamTime.held holds after this fold
    inputs: dict = {"steps": []}
    out = HealthFolded()
    assert s.divert(inputs, NOW, out, held) == [] and len(s.stash) == 2 and s.needed == {old}
    released = s.divert({"steps": [forwarded]}, NOW, HealthFolded(), {})  # the next fold applies the held record
    assert [e.step if e.__struct_config__.tag == "step_finished" else e.__struct_config__.tag
            for _r, e, _rec in released] == [1, 2, "run_ended"]
    other = next(r for r in (f"other-{i}" for i in range(1000))  # another moved run to partition 5
                 if partition_of(r.encode(), 6) == 5 and partition_of(r.encode(), 4) != 5)
    lone = _item(step(1, run=other, ts=NOW + 10), 3, NOW + 10, forwarded=True)
    later = [_item(step(4, run=run, ts=NOW + 40), 4, NOW + 40)]
    assert len(s.divert({"steps": later}, NOW, HealthFolded(), {"steps": [(lone[2], lone)]})) == 1  # not held back by it


def test_a_horizon_that_cannot_be_read_now_leaves_the_last_one_in_place() -> None:
    """While a transaction to the partition is still open, ``Horizons.read`` gives None: the task keeps the horizon
    it has (what it let through stays let through), and the next fold reads again."""
    s, run = _settling(), _moved_run()
    old = partition_of(run.encode(), 4)
    s.release([_item(step(1, run=run, ts=NOW), 0, NOW)], NOW, {})
    last = s.horizon = Horizon(read_ms=NOW + 10, first={old: None}, need={})

    class Unreadable(Horizons):
        async def read(self, partition: int, old: set[int]) -> None:
            self.reads += 1

    horizons = Unreadable(None, None)  # type: ignore[arg-type]  # never reads: no config, no partitions
    horizons.reads = 0
    for _ in range(2):
        asyncio.run(horizons.settle(5, s, {"steps": 10}))
    assert s.horizon is last and s.pending is None and horizons.reads == 2
