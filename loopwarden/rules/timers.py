"""A due-timer index: few entries per run, so memory follows runs, not events."""

from __future__ import annotations

import heapq
import sys
from collections.abc import Iterator


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

    Layout: ``heap`` holds each distinct deadline once, as a plain int (a heap of ints
    compares much faster than one of ``(deadline, run_id)`` tuples), and ``buckets`` maps
    a deadline to the run id queued at it (a list when several share it: ~100 B per entry,
    as much as a heap of tuples). ``heap`` and ``queued`` (run id -> its deadline, whose
    entry is in the heap or stood in for by an earlier one of the run) are public for read
    only, so a shell's hot path can skip a call: ``heap and heap[0] <= now`` is ``due(now)``;
    ``queued.get(run_id, inf) <= deadline`` means ``schedule`` would do nothing.
    """

    __slots__ = ("heap", "buckets", "queued", "_entries")

    def __init__(self) -> None:
        self.heap: list[int] = []
        self.buckets: dict[int, str | list[str]] = {}  # one run id, or a list of them
        self.queued: dict[str, int] = {}
        self._entries = 0  # run ids held in buckets, live or superseded

    def schedule(self, run_id: str, deadline: int | None) -> None:
        if deadline is None:
            return  # a queued entry, if any, is found stale when popped
        queued = self.queued
        was = queued.get(run_id)
        if was is not None and was <= deadline:
            return
        queued[run_id] = deadline
        self._push(run_id, deadline)

    def reschedule(self, run_id: str, deadline: int | None) -> None:
        """Make ``deadline`` the run's deadline, earlier or later than the one queued.

        For a change that moved the run's deadline for good (its health changed: a
        different timer now), so the run is not looked at again when the old deadline
        passes. Earlier: a new entry is pushed (the old one is dropped when its time
        comes). Later: nothing is pushed; the entry already in the heap, which is
        earlier, stands in for it, and ``pop_due`` pushes the run's real deadline when
        that entry comes up. A run's receipt window then its retention, say, cost one
        heap entry after the inactivity one instead of two more, and no stale pops.
        """
        queued = self.queued
        if deadline is None:
            queued.pop(run_id, None)
            return
        was = queued.get(run_id)
        if was == deadline:
            return
        queued[run_id] = deadline
        if was is not None and was < deadline:
            return  # an entry at or before `was` is in the heap: it stands in
        self._push(run_id, deadline)

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
            bucket = buckets.pop(deadline)
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

    def nbytes(self) -> int:
        """Bytes the queue holds: its heap, buckets and queued map with the objects only they hold (run id
        strings, deadlines). For memory benches; O(entries)."""
        size = sys.getsizeof(self.heap) + sum(map(sys.getsizeof, self.heap))
        size += sys.getsizeof(self.buckets) + sum(
            sys.getsizeof(v) for v in self.buckets.values() if v.__class__ is list)
        queued = self.queued
        return size + sys.getsizeof(queued) + sum(map(sys.getsizeof, queued)) + sum(map(sys.getsizeof, queued.values()))

    def clear(self) -> None:
        self.heap.clear()
        self.buckets.clear()
        self.queued.clear()
        self._entries = 0

    def __len__(self) -> int:
        """Entries held, live or superseded (not yet dropped)."""
        return self._entries
