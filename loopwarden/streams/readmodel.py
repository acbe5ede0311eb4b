"""The read API's index of one partition's runs: ordered by run id and by time in state, kept off the hot path.

``GET /runs`` pages through the runs a worker holds, filtered by state and agent, in
run-id order or oldest-in-state first. Scanning and sorting every store key per page
(what the worker did before) blocks the consuming event loop for as long as the
partition is large. Instead each :class:`~loopwarden.streams.task.PartitionTask` owns
one :class:`RunsIndex`:

- **built from the restored store** (:meth:`RunsIndex.add`, called while the task
  rebuilds its timers from the same decoded states: no second pass; then one
  :meth:`RunsIndex.merge` sorts them all at once, during recovery, not on a read);
- **fed by each committed transaction** (:meth:`RunsIndex.committed`): one dict write
  per transition or dropped run, nothing sorted on the hot path — the changes wait in
  ``pending`` and are merged into the ordered lists (``O(log n)`` each) by the next
  read, so a worker nobody reads pays almost nothing, and a read pays only for what
  changed since the last one;
- **dropped with the partition** (it lives on the task).

A page walks at most ``scan_max`` index entries (filters that match little cannot hold
the loop): it may then hold fewer runs than asked, with a ``next`` position to go on.
Entries hold only what a transition says (no run content): the run id, its state,
when it entered it, the reason, its agent and seq.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Iterator, Mapping
from datetime import datetime, timezone
from typing import NamedTuple

from sortedcontainers import SortedList

ORDERS = ("id", "age")
SCAN_MAX = 100_000  # index entries one page may walk
_AFTER_ALL = chr(0x10FFFF)  # sorts after every state name: (ts, run_id, _AFTER_ALL) > that run's entry


class Entry(NamedTuple):
    """One held run as the read API lists it; ordered by (since_ts, run_id): oldest in state first."""

    since_ts: int  # ts of the transition into ``state`` (ms)
    run_id: str
    state: str
    agent: str | None
    seq: int
    reason: str


_entry = tuple.__new__  # Entry from a tuple without NamedTuple's Python-level __new__ (several times faster)


def iso(ts_ms: int | None) -> str | None:
    """ISO-8601 UTC with milliseconds, e.g. ``2026-12-01T15:05:26.123Z``."""
    if ts_ms is None:
        return None
    try:
        return datetime.fromtimestamp(ts_ms / 1000, tz=timezone.utc).isoformat(timespec="milliseconds")[:-6] + "Z"
    except (OverflowError, OSError, ValueError):  # out of datetime's range: ms alone say it
        return None


def entry_document(e: Entry, now_ms: int) -> dict:
    """A run of a ``/runs`` page: state, since when (ms and ISO-8601), seconds in state, last reason."""
    return {"run_id": e.run_id, "state": e.state, "seq": e.seq, "agent": e.agent,
            "since_ts": e.since_ts, "since": iso(e.since_ts), "in_state_s": max(0, now_ms - e.since_ts) // 1000,
            "reason": e.reason}


class RunsIndex:
    """A partition's held runs (committed, with a health state; tombs are not runs), ordered two ways."""

    def __init__(self) -> None:
        self.entries: dict[str, Entry] = {}
        self._by_id: dict[str, SortedList] = {}  # state -> run ids
        self._by_age: dict[str, SortedList] = {}  # state -> entries
        self.pending: dict[str, tuple | None] = {}  # committed, not merged yet (Entry's fields); None: gone
        self._agents: dict[str, str] = {}  # one str object per agent name, shared by its entries

    def clear(self) -> None:
        self.__init__()

    def __len__(self) -> int:
        self.merge()
        return len(self.entries)

    # -- feeding ----------------------------------------------------------------------
    def add(self, state) -> None:
        """A run of the restored store (a RunState); sorted in by the next :meth:`merge`."""
        if state.health is None or state.tomb:
            return
        if state.history:
            _seq, ts, _to, reason = state.history[-1]
        else:  # a state written before history was kept
            ts, reason = state.last_seen_ts, ""
        self.pending[state.run_id] = (ts, state.run_id, state.health, state.agent, state.seq, reason)

    def committed(self, transitions: Iterable, states: Mapping[str, object]) -> None:
        """A transaction committed: its transitions (HealthTransitions, in order) and the runs it touched
        (run id -> RunState, None when dropped by retention). A dict write per transition or dropped run
        (a plain tuple: the Entry is made when merged)."""
        pending = self.pending
        for t in transitions:
            pending[t.run_id] = (t.ts, t.run_id, t.to_state, t.agent, t.seq, t.reason)
        for run_id, state in states.items():
            if state is None or state.tomb:
                pending[run_id] = None

    def _agent(self, agent: str | None) -> str | None:
        if agent is None:
            return None
        return self._agents.setdefault(agent, agent) if len(self._agents) < 10_000 else agent

    def merge(self) -> None:
        """Bring the ordered lists up to date with what was committed since the last read: one by one
        (O(log n) each), or all at once (a sort in C) when much changed, as after a restore."""
        if not self.pending:
            return
        entries, by_id, by_age, agent = self.entries, self._by_id, self._by_age, self._agent
        changes, self.pending = self.pending, {}
        if len(changes) > max(1000, len(entries) // 8):
            for run_id, new in changes.items():
                if new is None:
                    entries.pop(run_id, None)
                else:
                    entries[run_id] = _entry(Entry, (new[0], new[1], new[2], agent(new[3]), new[4], new[5]))
            groups: dict[str, list[Entry]] = {}
            for e in entries.values():
                groups.setdefault(e.state, []).append(e)
            by_id.clear()
            by_age.clear()
            for state, group in groups.items():
                by_age[state] = SortedList(group)
                by_id[state] = SortedList(e.run_id for e in group)
            return
        for run_id, new in changes.items():
            old = entries.pop(run_id, None)
            if old is not None:
                by_id[old.state].remove(run_id)
                by_age[old.state].remove(old)
            if new is not None:
                e = entries[run_id] = _entry(Entry, (new[0], new[1], new[2], agent(new[3]), new[4], new[5]))
                if e.state not in by_id:
                    by_id[e.state], by_age[e.state] = SortedList(), SortedList()
                by_id[e.state].add(run_id)
                by_age[e.state].add(e)

    # -- reading ----------------------------------------------------------------------
    def get(self, run_id: str) -> Entry | None:
        self.merge()
        return self.entries.get(run_id)

    def walk(self, state: str | None, order: str, after: tuple | None) -> Iterator[Entry]:
        """Every held entry in ``state`` (all if None) in ``order``, strictly after ``after``:
        ``(run_id,)`` for order ``id``, ``(since_ts, run_id)`` for order ``age``."""
        self.merge()
        states = [state] if state is not None else list(self._by_id)
        if order == "id":
            start = after[0] if after else None
            lists = [self._by_id[s].irange(minimum=start, inclusive=(False, True)) if start is not None
                     else iter(self._by_id[s]) for s in states if s in self._by_id]
            entries = self.entries
            return (entries[r] for r in heapq.merge(*lists))
        start = (after[0], after[1], _AFTER_ALL) if after else None
        lists = [self._by_age[s].irange(minimum=start) if start is not None else iter(self._by_age[s])
                 for s in states if s in self._by_age]
        return heapq.merge(*lists)


def page(indexes: Mapping[int, RunsIndex], *, state: str | None, agent: str | None, order: str,
         cursor: tuple | None, limit: int, now_ms: int, scan_max: int = SCAN_MAX) -> tuple[list[dict], tuple | None]:
    """A page of the runs of these partitions after ``cursor``, and the cursor of the next page (None: the end).

    Order ``id``: by (partition, run id), cursor ``(partition, run_id)``. Order ``age``: oldest in
    state first across all partitions, cursor ``("age", since_ts, run_id)``. At most ``scan_max``
    entries are walked: a page can be short (even empty) and still have a next cursor."""
    found: list[dict] = []
    scanned = 0
    if order == "age":
        after = (cursor[1], cursor[2]) if cursor else None
        walks = [_tagged(indexes[p].walk(state, "age", after), p) for p in sorted(indexes)]
        last = None
        for e, p in heapq.merge(*walks):
            scanned += 1
            last = e
            if agent is None or e.agent == agent:
                found.append({**entry_document(e, now_ms), "partition": p})
                if len(found) >= limit:
                    break
            if scanned >= scan_max:
                break
        else:
            return found, None
        return found, ("age", last.since_ts, last.run_id)
    for p in sorted(indexes):
        if cursor is not None and p < cursor[0]:
            continue
        after = (cursor[1],) if cursor is not None and p == cursor[0] else None
        for e in indexes[p].walk(state, "id", after):
            scanned += 1
            if agent is None or e.agent == agent:
                found.append({**entry_document(e, now_ms), "partition": p})
                if len(found) >= limit:
                    return found, (p, e.run_id)
            if scanned >= scan_max:
                return found, (p, e.run_id)
    return found, None


def _tagged(entries: Iterator[Entry], partition: int) -> Iterator[tuple[Entry, int]]:
    for e in entries:
        yield e, partition
