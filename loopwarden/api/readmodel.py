"""The read API's index of one partition's runs: ordered by run id and by time in state, kept off the hot path.

``GET /runs`` pages through the runs a worker holds, filtered by state and agent, in
run-id order or oldest-in-state first. Scanning and sorting every store key per page
would block the consuming event loop for as long as the partition is large. Instead each :class:`~loopwarden.stages.health.task.PartitionTask` owns
one :class:`RunsIndex` over its store:

- **built from the restored store** (:meth:`RunsIndex.add`, called while the task
  rebuilds its timers from the same decoded states: no second pass; then one
  :meth:`RunsIndex.merge` sorts them all at once, during recovery, not on a read);
- **fed by each committed transaction** (:meth:`RunsIndex.committed`): the keys of the
  runs it wrote go into ``pending`` (one C-level set update per batch, nothing decoded or
  sorted on the hot path) and the next read merges them into the ordered lists
  (``O(log n)`` each, reading their committed state from the store), so a worker nobody
  reads pays almost nothing, and a read pays only for what changed since the last one;
  once the changes outgrow half the listed runs (and ``BULK_MIN``) ``pending`` is dropped
  and the next read lists the whole store anew, so ``pending`` never holds a slot for
  every run of a worker nobody reads (a set's table: 27-107 B a run as it grows);
- **dropped with the partition** (it lives on the task).

**Memory: one small object per run.** The lists hold the memory store's own key objects
(``bytes``, shared with the store's dict: the key a run was first written under); the
one per-run value is an ``int``, when the run entered its state and which state
(``since_ts << 4 | state number``, shared by the dict and the age list's sort keys).
Everything a page shows (state, agent, seq, reason) is read from the committed state in
the store when the page is made (:func:`~loopwarden.rules.codec.decode_listing`). About
110 B per run once read, a set slot (~30-50 B) per run changed since the last read, for at
most half the listed runs (bench/README.md, b state). The index it replaced held a tuple, a ``str`` and an
``int`` per run: ~210 B until read, ~185 B once read.

A page walks at most ``scan_max`` index entries (filters that match little cannot hold
the loop): it may then hold fewer runs than asked, with a ``next`` position to go on.
Entries hold only what a transition says (no run content): the run id, its state,
when it entered it, the reason, its agent and seq.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator, Mapping
from datetime import datetime, timezone
from typing import NamedTuple

from sortedcontainers import SortedKeyList, SortedList

from loopwarden.codecs import STATES
from loopwarden.rules import RunState
from loopwarden.rules.codec import decode_listing

ORDERS = ("id", "age")
BULK_MIN = 1000  # changes from which a merge sorts each state's lists anew rather than one by one
# Pending changes beyond max(BULK_MIN, listed runs // STALE_SHARE) are not kept: the next read lists the store anew
# (every run decoded: at most STALE_SHARE times the changes a bulk merge would have decoded).
STALE_SHARE = 2
# A run's one value in the index: since_ts << 4 | its state's number (15: a state this build does not list
# in STATES), so that the lists' sort key says which list holds it. Within a state it orders by since_ts.
_NUMBER = {s: i for i, s in enumerate(STATES)}
assert len(STATES) < 15


def _value(since_ts: int, health: str) -> int:
    return since_ts << 4 | _NUMBER.get(health, 15)


class Entry(NamedTuple):
    """One held run as the read API lists it; ordered by (since_ts, run_id): oldest in state first."""

    since_ts: int  # ts of the transition into ``state`` (ms)
    run_id: str
    state: str
    agent: str | None
    seq: int
    reason: str


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

    def __init__(self, store: Mapping[bytes, bytes]) -> None:
        self.store = store  # the partition's committed states: key -> encoded state
        self.pending: set[bytes] = set()  # keys written since the last merge (their state is in the store)
        # The changes since the last read outgrew half the listed runs (STALE_SHARE): pending is dropped, and the next
        # read lists the whole store anew. So a worker nobody reads holds no set slot per run.
        self.stale = False
        self._since: dict[bytes, int] = {}  # key -> since_ts << 4 | state number (_value) of each listed run
        self._by_id: dict[str, SortedList] = {}  # state -> keys
        self._by_age: dict[str, SortedKeyList] = {}  # state -> keys by since_ts (ties: any order, see walk)
        self._restored: dict[str, list[bytes]] = {}  # state -> keys added by a rebuild, not merged yet

    def clear(self) -> None:
        self.__init__(self.store)  # type: ignore[misc]

    def __len__(self) -> int:
        self.merge()
        return len(self._since)

    # -- feeding ----------------------------------------------------------------------
    def add(self, key: bytes, state: RunState) -> None:
        """A run of the restored store (its key, as the store holds it, and its decoded state); sorted in by
        the next :meth:`merge`."""
        if state.health is not None and not state.tomb:
            self._since[key] = _value(state.history[-1][1] if state.history else state.last_seen_ts, state.health)
            self._restored.setdefault(state.health, []).append(key)

    def committed(self, changes: Mapping[bytes, bytes | None]) -> None:
        """A transaction committed and its changes are in the store: the keys it wrote (key -> state, None for
        a run dropped; the store's own keys are skipped when merged). One set update, in C; a run dropped
        that was never listed leaves ``pending`` at once (nobody reading must not mean growing)."""
        if self.stale:
            return
        pending, since = self.pending, self._since
        pending.update(changes)
        for key in [k for k, v in changes.items() if v is None]:
            if key not in since:
                pending.discard(key)
        if len(pending) > max(BULK_MIN, len(since) // STALE_SHARE):
            self.stale, self.pending = True, set()

    def merge(self) -> None:
        """Bring the ordered lists up to date with what was committed since the last read: one by one
        (O(log n) each), or all at once (a sort in C) when much changed, as after a restore."""
        since, by_id, by_age = self._since, self._by_id, self._by_age
        restored, self._restored = self._restored, {}
        for health, keys in restored.items():
            self._list(health).update(keys)
            by_age[health].update(keys)
        if self.stale:
            self.stale = False
            self._rebuild(None)
            return
        if not self.pending:
            return
        changes, self.pending = self.pending, set()
        if len(changes) > max(BULK_MIN, len(since) // 8):
            self._rebuild(changes)
            return
        store = self.store
        for key in changes:
            if key[:1] == b"\xff":
                continue
            if key in since:
                key = self._unlist(key)  # the key object the lists (and the store) hold
            raw = store.get(key)
            listed = decode_listing(raw, key.decode()) if raw is not None else None
            if listed is None:  # dropped by retention, or a tomb
                since.pop(key, None)
                continue
            since[key] = _value(listed[0], listed[2])
            self._list(listed[2]).add(key)
            by_age[listed[2]].add(key)

    def _rebuild(self, changes: set[bytes] | None) -> None:
        """Merge many changes at once (None: every run of the store, after more changes than :meth:`committed`
        keeps): read each from the store, then sort every state's lists anew (in C)."""
        since, store = self._since, self.store
        if changes is None:
            since.clear()
            groups: dict[str, list[bytes]] = {}
            items = store.items()  # the store's own key objects
        else:
            groups = {h: [k for k in ids if k not in changes] for h, ids in self._by_id.items()}
            held = {k: k for ids in self._by_id.values() for k in ids if k in changes}  # the key objects listed
            items = ((k, store.get(k)) for k in (held.get(key, key) for key in changes))
        for key, raw in items:
            if key[:1] == b"\xff":
                continue
            listed = decode_listing(raw, key.decode()) if raw is not None else None
            if listed is None:  # dropped by retention, or a tomb
                since.pop(key, None)
                continue
            since[key] = _value(listed[0], listed[2])
            groups.setdefault(listed[2], []).append(key)
        self._by_id.clear()
        self._by_age.clear()
        for health, keys in groups.items():
            self._list(health).update(keys)
            self._by_age[health].update(keys)

    def _list(self, health: str) -> SortedList:
        if health not in self._by_id:
            self._by_id[health] = SortedList()
            self._by_age[health] = SortedKeyList(key=self._since.__getitem__)
        return self._by_id[health]

    def _unlist(self, key: bytes) -> bytes:
        """Take a listed run out of its state's lists; returns the key object they held."""
        number = self._since[key] & 15
        for health, ids in ([(STATES[number], self._by_id[STATES[number]])] if number < 15 else self._by_id.items()):
            if key in ids:
                held = next(ids.irange(key, key))
                ids.remove(held)
                self._by_age[health].remove(held)  # by its value, still in _since
                return held
        return key

    # -- reading ----------------------------------------------------------------------
    def _read(self, key: bytes) -> Entry:
        return tuple.__new__(Entry, decode_listing(self.store[key], key.decode()))  # type: ignore[arg-type]

    def get(self, run_id: str) -> Entry | None:
        self.merge()
        key = run_id.encode()
        return self._read(key) if key in self._since else None

    def walk(self, state: str | None, order: str, after: tuple | None) -> Iterator[Entry]:
        """Every held entry in ``state`` (all if None) in ``order``, strictly after ``after``:
        ``(run_id,)`` for order ``id``, ``(since_ts, run_id)`` for order ``age``."""
        self.merge()
        states = [state] if state is not None else list(self._by_id)
        if order == "id":
            start = after[0].encode() if after else None
            lists = [self._by_id[s].irange(minimum=start, inclusive=(False, True)) if start is not None
                     else iter(self._by_id[s]) for s in states if s in self._by_id]
            return map(self._read, heapq.merge(*lists))
        since = self._since
        lists = [self._by_age[s].irange_key(min_key=after[0] << 4) if after else iter(self._by_age[s])
                 for s in states if s in self._by_age]
        return self._by_age_after(heapq.merge(*lists, key=since.__getitem__), after)

    def _by_age_after(self, keys: Iterator[bytes], after: tuple | None) -> Iterator[Entry]:
        """Entries of ``keys`` (in since_ts order) in (since_ts, run_id) order, strictly after ``after``:
        runs that entered their state in the same ms are put in run-id order here."""
        since, start = self._since, ((after[0], after[1].encode()) if after else None)
        tie: list[bytes] = []
        tie_ts = None
        for key in keys:
            ts = since[key] >> 4
            if ts != tie_ts and tie:
                yield from self._tie(tie_ts, tie, start)  # type: ignore[arg-type]
                tie = []
            tie_ts = ts
            tie.append(key)
        if tie:
            yield from self._tie(tie_ts, tie, start)  # type: ignore[arg-type]

    def _tie(self, ts: int, keys: list[bytes], start: tuple | None) -> Iterator[Entry]:
        if len(keys) > 1:
            keys.sort()
        for key in keys:
            if start is None or (ts, key) > start:
                yield self._read(key)
