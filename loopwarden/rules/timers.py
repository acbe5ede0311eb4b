"""A due-timer index: at most one heap entry per run, so memory follows runs, not events."""

from __future__ import annotations

import heapq
from collections.abc import Iterator


class TimerQueue:
    """Deadlines of runs, popped in deadline order (ties by run id).

    ``schedule`` is called after every change of a run; it adds an entry only when
    the run's deadline moved earlier than the one already queued. An entry whose
    deadline turns out stale when popped is handed back anyway: the caller checks
    the run's real next deadline and schedules it again if it moved later.
    Per change O(log n) at most; per tick O(due entries).
    """

    def __init__(self) -> None:
        self._heap: list[tuple[int, str]] = []
        self._queued: dict[str, int] = {}

    def schedule(self, run_id: str, deadline: int | None) -> None:
        if deadline is None:
            return  # a queued entry, if any, is found stale when popped
        queued = self._queued.get(run_id)
        if queued is not None and queued <= deadline:
            return
        self._queued[run_id] = deadline
        heapq.heappush(self._heap, (deadline, run_id))

    def due(self, now_ms: int) -> bool:
        """Whether an entry (perhaps stale) has deadline <= now_ms: ``pop_due`` would yield or drop something."""
        heap = self._heap
        return bool(heap) and heap[0][0] <= now_ms

    def pop_due(self, now_ms: int) -> Iterator[tuple[int, str]]:
        """Entries with deadline <= now_ms, earliest first; may yield entries the caller finds stale."""
        heap = self._heap
        while heap and heap[0][0] <= now_ms:
            deadline, run_id = heapq.heappop(heap)
            if self._queued.get(run_id) == deadline:
                del self._queued[run_id]
                yield deadline, run_id

    def clear(self) -> None:
        self._heap.clear()
        self._queued.clear()

    def __len__(self) -> int:
        return len(self._heap)
