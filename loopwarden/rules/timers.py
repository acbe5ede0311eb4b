"""A due-timer index: few entries per run, so memory follows runs, not events."""

from __future__ import annotations

import heapq
from collections.abc import Iterator


class TimerQueue:
    """Deadlines of runs, popped in deadline order (ties by run id).

    ``schedule`` is called after every change of a run; it adds an entry only when
    the run's deadline moved earlier than the one already queued. An entry whose
    deadline turns out stale when popped is handed back anyway: the caller checks
    the run's real next deadline and schedules it again if it moved later. After a
    change of health (a different timer, often a later one) ``reschedule`` queues the
    new deadline at once, so the run is not looked at again when the old one passes.
    Per change O(log n) at most; per tick O(due entries).

    Layout: ``heap`` holds each distinct deadline once, as a plain int (a heap of ints
    compares much faster than one of ``(deadline, run_id)`` tuples), and ``buckets`` maps
    a deadline to the run id queued at it (a list when several share it: ~100 B per entry,
    as much as a heap of tuples). ``heap`` and ``queued`` (run id -> the deadline
    queued for it, the run's one live entry) are public for read only, so a shell's hot
    path can skip a call: ``heap and heap[0] <= now`` is ``due(now)``;
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
        queued = self.queued.get(run_id)
        if queued is not None and queued <= deadline:
            return
        self.reschedule(run_id, deadline)

    def reschedule(self, run_id: str, deadline: int | None) -> None:
        """Queue exactly ``deadline`` for the run, earlier or later than the one queued.

        For a change that moved the run's deadline for good (its health changed: a
        different timer now). The entry queued before stays in its bucket but is no
        longer the run's: ``pop_due`` drops it when its time comes, and nobody has to
        look at the run to find it stale. So a run holds one live entry and at most one
        superseded entry per health change whose deadline is still ahead.
        """
        if deadline is None:
            self.queued.pop(run_id, None)
            return
        queued = self.queued
        if queued.get(run_id) != deadline:
            queued[run_id] = deadline
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
                if queued.get(run_id) == deadline:  # the run's live entry (not superseded, not yielded)
                    del queued[run_id]
                    yield deadline, run_id

    def clear(self) -> None:
        self.heap.clear()
        self.buckets.clear()
        self.queued.clear()
        self._entries = 0

    def __len__(self) -> int:
        """Entries held, live or superseded (not yet dropped)."""
        return self._entries
