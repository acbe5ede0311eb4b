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

    Each run has one *entry*: its key in the bucket of a deadline in the heap, at or
    before the run's queued deadline. A deadline that moves later touches one structure
    (``queued``) and ``moved`` remembers, once, where the entry stays (the first later
    move of an entry; the next ones find it there): when the entry comes due the queue
    itself pushes it again at the run's queued deadline, without handing it out. Only a
    new run, or a deadline earlier than the run's entry, pushes (the entry it leaves
    becomes stale, dropped when it comes due, as is the entry of a run unscheduled). Stale
    entries are bounded: when, right after one of those two changes, they outnumber the
    runs queued by ``stale_slack``, the heap and buckets are rebuilt from ``queued``
    (O(runs), after at least as many such changes). ``moved``'s table is copied smaller when a tick leaves it mostly
    empty (a dict keeps its peak size). Per change O(log n) at most; per tick O(due entries).

    A run is named by whatever key its shell gives (replay: the run id; the worker: the
    store's ``bytes`` key, so that the queue holds the store's own key object, not a second
    object per run: :meth:`held`).

    Layout: ``heap`` holds each distinct deadline once, as a plain int (a heap of ints
    compares much faster than one of ``(deadline, run_id)`` tuples), and ``buckets`` maps
    a deadline to the run id queued at it (a list when several share it: ~100 B per entry,
    as much as a heap of tuples; from ``bucket_index_at`` runs on, a dict of each key to
    itself, so that :meth:`held` stays O(1): runs changed at one clock value, as a tick or a
    backlog's receipts change them, all get one next deadline). ``heap`` and ``queued`` (run
    id -> its deadline) are public for read only, so a shell's hot path can skip a call:
    ``heap and heap[0] <= now`` is ``due(now)``; ``queued.get(run_id, inf) <= deadline`` means
    ``schedule`` would do nothing.
    ``moved``: run id -> the deadline of its entry, for the runs whose queued deadline is later.
    """

    __slots__ = ("heap", "buckets", "queued", "moved", "_entries")
    stale_slack = 1024  # stale entries allowed beyond the runs queued before a rebuild
    # A bucket this long becomes a dict (key -> key, the live entry's object). Scanning a list of 2,900 keys in
    # held() took 15 % of the worker's CPU in bench e (py-spy): runs fired at one clock share a deadline.
    bucket_index_at = 32

    def __init__(self) -> None:
        self.heap: list[int] = []
        self.buckets: dict[int, str | list[str]] = {}  # one run id, or a list of them
        self.queued: dict[str, int] = {}
        self.moved: dict[str, int] = {}  # run id -> its entry's deadline, when earlier than queued[run id]
        self._entries = 0  # run ids held in buckets, live or stale

    def held(self, run_id: Hashable) -> Hashable | None:
        """The key object the queue holds for this run (equal to ``run_id``), or None: found in the bucket of
        the run's entry, O(1). A shell that names its runs with this object keeps one object per run
        (the queue itself pushes a run under the object it already holds)."""
        deadline = self.queued.get(run_id)
        if deadline is None:
            return None
        return self._held_at(run_id, self.moved.get(run_id, deadline), None)

    def _held_at(self, run_id, deadline: int, missing):
        bucket = self.buckets.get(deadline)
        kind = bucket.__class__
        if kind is list:  # a few runs: scanned
            for key in bucket:  # type: ignore[union-attr]
                if key == run_id:
                    return key
            return missing
        if kind is dict:  # many runs: indexed
            return bucket.get(run_id, missing)  # type: ignore[union-attr]
        return bucket if bucket is not None and bucket == run_id else missing

    def schedule(self, run_id: str, deadline: int | None) -> None:
        if deadline is None:
            return  # a queued entry, if any, is found stale when popped
        queued = self.queued
        was = queued.get(run_id)
        if was is None:
            queued[run_id] = deadline
            self._push(run_id, deadline)
        elif deadline < was:
            self._earlier(run_id, deadline, was)

    def reschedule(self, run_id: str, deadline: int | None) -> None:
        """Make ``deadline`` the run's deadline, earlier or later than the one queued.

        For a change that moved the run's deadline for good (its health changed: a
        different timer now), so the run is not looked at again when the old deadline
        passes. Later: only ``queued`` changes (and ``moved``, on the entry's first move);
        the entry is pushed again at the new deadline when it comes due, not handed out.
        Earlier: as :meth:`schedule`.
        """
        queued = self.queued
        if deadline is None:
            if queued.pop(run_id, None) is not None:
                self.moved.pop(run_id, None)  # the entry, stale now, is dropped when it comes due
                self._bound()
            return
        was = queued.get(run_id)
        if was is None:
            queued[run_id] = deadline
            self._push(run_id, deadline)
        elif deadline < was:
            self._earlier(run_id, deadline, was)
        elif was != deadline:  # later: the entry stays where it is
            moved = self.moved
            if run_id not in moved:  # under the key object the entry holds: a shell's new one would be a second
                moved[self._held_at(run_id, was, run_id)] = was  # object per run (~64 B in bench c)
            queued[run_id] = deadline

    def _earlier(self, run_id, deadline: int, was: int) -> None:
        """Queue ``deadline``, earlier than the run's queued one (``was``)."""
        moved = self.moved
        entry = moved.get(run_id, was)
        if entry < deadline:  # still after the entry: it stands in for this deadline too
            self.queued[run_id] = deadline
            return
        if entry != was:
            del moved[run_id]
        if entry == deadline:  # the entry is at this deadline already
            self.queued[run_id] = deadline
            return
        run_id = self._held_at(run_id, entry, run_id)  # the key object already held: no second one
        self.queued[run_id] = deadline
        self._push(run_id, deadline)  # the entry left behind is stale: dropped when it comes due
        self._bound()

    def _bound(self) -> None:
        """After a change that left a stale entry: rebuild if stale entries outnumber the runs queued by
        ``stale_slack``. Nothing else adds a stale entry, so they never exceed the most runs queued at once plus
        ``stale_slack``."""
        if self._entries > 2 * len(self.queued) + self.stale_slack:
            self._rebuild()

    def _push(self, run_id: str, deadline: int) -> None:
        if self._add(run_id, deadline):
            heapq.heappush(self.heap, deadline)

    def _add(self, run_id, deadline: int) -> bool:
        """Put ``run_id`` in the bucket of ``deadline``; whether the bucket is new (its deadline not in the heap)."""
        buckets = self.buckets
        bucket = buckets.get(deadline)
        if bucket is None:  # most deadlines are distinct (ms): the run id itself, no list
            buckets[deadline] = run_id
            self._entries += 1
            return True
        kind = bucket.__class__
        if kind is list:
            if len(bucket) < self.bucket_index_at:  # type: ignore[arg-type]
                bucket.append(run_id)  # type: ignore[union-attr]
                self._entries += 1
                return False
            # A run's entries at one deadline (a stale one, then a live one) become one, under the key the dict
            # had first, whose value is the latest (the live entry's object: what held() and pop_due hand out).
            index = buckets[deadline] = {key: key for key in bucket}  # type: ignore[union-attr]
            self._entries -= len(bucket) - len(index)  # type: ignore[arg-type]
            bucket = index
            kind = dict
        if kind is dict:
            self._entries += run_id not in bucket  # type: ignore[operator]
            bucket[run_id] = run_id  # type: ignore[index]
            return False
        buckets[deadline] = [bucket, run_id]  # type: ignore[list-item]
        self._entries += 1
        return False

    def _rebuild(self) -> None:
        """Drop every stale entry: one entry per run queued, at its queued deadline (in place: a shell reads
        ``heap``). O(runs queued), after more stale pushes than runs queued."""
        heap, buckets = self.heap, self.buckets
        buckets.clear()
        self._entries = 0
        for run_id, deadline in self.queued.items():  # the keys are the objects the queue holds
            self._add(run_id, deadline)
        heap[:] = buckets
        heapq.heapify(heap)
        self.moved.clear()

    def due(self, now_ms: int) -> bool:
        """Whether an entry (perhaps stale) has deadline <= now_ms: ``pop_due`` would yield or drop something."""
        heap = self.heap
        return bool(heap) and heap[0] <= now_ms

    def pop_due(self, now_ms: int) -> Iterator[tuple[int, str]]:
        """Entries with deadline <= now_ms, earliest first; may yield entries the caller finds stale.

        The caller may schedule while iterating: a deadline already due is popped in turn.
        """
        heap, buckets, queued, moved = self.heap, self.buckets, self.queued, self.moved
        while heap and heap[0] <= now_ms:
            deadline = heapq.heappop(heap)
            bucket = buckets.pop(deadline, None)
            if bucket is None:  # nothing queued at it (defensive: a heap int always has its bucket)
                continue
            kind = bucket.__class__
            if kind is list:
                run_ids = sorted(bucket)  # type: ignore[arg-type]
            elif kind is dict:
                run_ids = sorted(bucket.values())  # type: ignore[union-attr]
            else:
                run_ids = (bucket,)  # type: ignore[assignment]
            self._entries -= len(run_ids)
            for run_id in run_ids:
                live = queued.get(run_id)
                if live == deadline:  # the run's deadline (not superseded, not yielded)
                    del queued[run_id]
                    yield deadline, run_id
                elif live is not None and live > deadline and moved.get(run_id) == deadline:
                    del moved[run_id]  # the run's entry, standing in for its later deadline: queue that
                    self._push(run_id, live)
                # otherwise stale (the run's entry is elsewhere, or it has no deadline now): dropped
        if sys.getsizeof(moved) > 128 * len(moved) + 4096:  # a dict keeps its table at its peak: copy it smaller
            self.moved = dict(moved)

    def nbytes(self, keys: bool = True) -> int:
        """Bytes the queue holds: its heap, buckets, queued and moved maps with the objects only they hold
        (deadlines, and the run keys unless ``keys`` is false: a shell's keys shared with its store). For memory
        benches; O(entries)."""
        size = sys.getsizeof(self.heap) + sum(map(sys.getsizeof, self.heap))
        size += sys.getsizeof(self.buckets) + sum(
            sys.getsizeof(v) for v in self.buckets.values() if v.__class__ is list or v.__class__ is dict)
        queued = self.queued
        size += sys.getsizeof(queued) + sys.getsizeof(self.moved)  # moved's deadlines: the entries' own
        held = set(map(id, self.heap))
        size += sum(sys.getsizeof(v) for v in queued.values() if id(v) not in held)
        return size + (sum(map(sys.getsizeof, queued)) if keys else 0)

    def clear(self) -> None:
        self.heap.clear()
        self.buckets.clear()
        self.queued.clear()
        self.moved.clear()
        self._entries = 0

    def __len__(self) -> int:
        """Entries held, live or stale (not yet dropped)."""
        return self._entries
