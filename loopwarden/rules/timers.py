"""A due-timer index: few entries per run, so memory follows runs, not events."""

from __future__ import annotations

import heapq
import sys
from collections.abc import Hashable, Iterator


class TimerQueue:
    """Deadlines of runs, popped in deadline order (ties by run id).

    ``schedule`` is called after every change of a run; it adds an entry only when
    the run's deadline moved earlier than the one already queued. An entry whose
    deadline turns out stale when popped is handed back anyway: the caller checks
    the run's real next deadline and schedules it again if it moved later. After a
    change of health (a different timer, often a later one) ``reschedule`` records the
    new deadline at once, so the run is not looked at again when the old one passes.
    Invariant: every run in ``queued`` has an entry in the heap at or before its
    deadline. Per change O(log n) at most; per tick O(due entries).

    A run is named by whatever key its shell gives (replay: the run id; the worker: the
    store's ``bytes`` key, so that the queue holds the store's own key object, not a second
    object per run: :meth:`held`).

    Layout: ``heap`` holds each distinct deadline once, as a plain int (a heap of ints
    compares much faster than one of ``(deadline, run_id)`` tuples), and ``buckets`` maps
    a deadline to the run id queued at it (a list when several share it: ~100 B per entry,
    as much as a heap of tuples). ``heap`` and ``queued`` (run id -> its deadline, whose
    bucket holds the run's key) are public for read only, so a shell's hot path can skip a call: ``heap and heap[0] <= now`` is ``due(now)``;
    ``queued.get(run_id, inf) <= deadline`` means ``schedule`` would do nothing.
    """

    __slots__ = ("heap", "buckets", "queued", "_entries")

    def __init__(self) -> None:
        self.heap: list[int] = []
        self.buckets: dict[int, str | list[str]] = {}  # one run id, or a list of them
        self.queued: dict[str, int] = {}
        self._entries = 0  # run ids held in buckets, live or superseded

    def held(self, run_id: Hashable) -> Hashable | None:
        """The key object the queue holds for this run (equal to ``run_id``), or None: found in the bucket of
        the run's queued deadline, O(1). A shell that names its runs with this object keeps one object per run
        (the queue itself pushes a run under the object it already holds)."""
        deadline = self.queued.get(run_id)
        return None if deadline is None else self._held_at(run_id, deadline, None)

    def _held_at(self, run_id, deadline: int, missing):
        bucket = self.buckets.get(deadline)
        if bucket.__class__ is list:
            for key in bucket:  # type: ignore[union-attr]
                if key == run_id:
                    return key
            return missing
        return bucket if bucket is not None and bucket == run_id else missing

    def schedule(self, run_id: str, deadline: int | None) -> None:
        if deadline is None:
            return  # a queued entry, if any, is found stale when popped
        queued = self.queued
        was = queued.get(run_id)
        if was is not None:
            if was <= deadline:
                return
            run_id = self._held_at(run_id, was, run_id)  # the key object already held: no second one
        queued[run_id] = deadline
        self._push(run_id, deadline)

    def reschedule(self, run_id: str, deadline: int | None) -> None:
        """Make ``deadline`` the run's deadline, earlier or later than the one queued.

        For a change that moved the run's deadline for good (its health changed: a
        different timer now), so the run is not looked at again when the old deadline
        passes. Earlier: a new entry is pushed (the old one is dropped when its time
        comes). Later: the run's entry moves to the new deadline's bucket (its old
        deadline stays in the heap, with no bucket, until it passes: an int compared,
        nothing loaded). The run's key stays in the bucket of its queued deadline, so
        :meth:`held` finds it.
        """
        queued = self.queued
        if deadline is None:
            queued.pop(run_id, None)
            return
        was = queued.get(run_id)
        if was == deadline:
            return
        if was is not None:  # the key object already held: no second one
            run_id = self._unbucket(run_id, was) if was < deadline else self._held_at(run_id, was, run_id)
        queued[run_id] = deadline
        self._push(run_id, deadline)

    def _unbucket(self, run_id, deadline: int):
        """Take the run's entry out of ``deadline``'s bucket (its heap entry stays, and is skipped when
        popped); returns the key object the bucket held (``run_id`` when none)."""
        buckets = self.buckets
        bucket = buckets.get(deadline)
        if bucket is None:
            return run_id
        if bucket.__class__ is list:
            for i, key in enumerate(bucket):  # type: ignore[arg-type]
                if key == run_id:
                    del bucket[i]  # type: ignore[union-attr]
                    self._entries -= 1
                    return key
            return run_id
        if bucket != run_id:
            return run_id
        del buckets[deadline]
        self._entries -= 1
        return bucket

    def _push(self, run_id: str, deadline: int) -> None:
        buckets = self.buckets
        bucket = buckets.get(deadline)
        if bucket is None:  # most deadlines are distinct (ms): the run id itself, no list
            buckets[deadline] = run_id
            heapq.heappush(self.heap, deadline)
        elif bucket.__class__ is list:
            bucket.append(run_id)
        else:
            buckets[deadline] = [bucket, run_id]  # type: ignore[list-item]
        self._entries += 1

    def due(self, now_ms: int) -> bool:
        """Whether an entry (perhaps stale) has deadline <= now_ms: ``pop_due`` would yield or drop something."""
        heap = self.heap
        return bool(heap) and heap[0] <= now_ms

    def pop_due(self, now_ms: int) -> Iterator[tuple[int, str]]:
        """Entries with deadline <= now_ms, earliest first; may yield entries the caller finds stale.

        The caller may schedule while iterating: a deadline already due is popped in turn.
        """
        heap, buckets, queued = self.heap, self.buckets, self.queued
        while heap and heap[0] <= now_ms:
            deadline = heapq.heappop(heap)
            bucket = buckets.pop(deadline, None)
            if bucket is None:  # its entries moved to a later deadline (reschedule)
                continue
            if bucket.__class__ is list:
                run_ids = sorted(bucket)  # type: ignore[arg-type]
            else:
                run_ids = (bucket,)  # type: ignore[assignment]
            self._entries -= len(run_ids)
            for run_id in run_ids:
                live = queued.get(run_id)
                if live == deadline:  # the run's deadline (not superseded, not yielded)
                    del queued[run_id]
                    yield deadline, run_id
                elif live is not None and live > deadline:  # it stood in for a later deadline: queue that
                    self._push(run_id, live)
                # otherwise superseded by an earlier entry, or the run has no deadline now: dropped

    def nbytes(self, keys: bool = True) -> int:
        """Bytes the queue holds: its heap, buckets and queued map with the objects only they hold (deadlines,
        and the run keys unless ``keys`` is false: a shell's keys shared with its store). For memory benches;
        O(entries)."""
        size = sys.getsizeof(self.heap) + sum(map(sys.getsizeof, self.heap))
        size += sys.getsizeof(self.buckets) + sum(
            sys.getsizeof(v) for v in self.buckets.values() if v.__class__ is list)
        queued = self.queued
        size += sys.getsizeof(queued) + sum(map(sys.getsizeof, queued.values()))
        return size + (sum(map(sys.getsizeof, queued)) if keys else 0)

    def clear(self) -> None:
        self.heap.clear()
        self.buckets.clear()
        self.queued.clear()
        self._entries = 0

    def __len__(self) -> int:
        """Entries held, live or superseded (not yet dropped)."""
        return self._entries
