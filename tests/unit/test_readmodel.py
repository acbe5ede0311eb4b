"""The read API's ordered index (loopwarden.api.readmodel): pages equal a brute-force sort of what was committed."""

from __future__ import annotations

import random
from types import SimpleNamespace

from hypothesis import given, settings
from hypothesis import strategies as st

from loopwarden.codecs import STATES
from loopwarden.rules import RunState, encode_state
from loopwarden.api.http import decode_cursor, encode_cursor
from loopwarden.api import readmodel
from loopwarden.api.pages import page
from loopwarden.api.readmodel import RunsIndex, iso

AGENTS = ("planner", "coder", None)


def transition(run_id: str, ts: int, state: str, agent, seq: int, reason: str = "r"):
    return SimpleNamespace(run_id=run_id, ts=ts, to_state=state, agent=agent, seq=seq, reason=reason)


def commit(index: RunsIndex, transitions=(), dropped: dict | None = None) -> None:
    """What a committed batch does: the runs' states (after these transitions) written to the index's store,
    then the changes handed to the index. ``dropped``: run id -> None (gone) or a tomb state."""
    changes: dict[bytes, bytes | None] = {}
    for t in transitions:
        state = RunState(run_id=t.run_id, health=t.to_state, seq=t.seq + 1, agent=t.agent, last_seen_ts=t.ts + 7)
        state.history = [(t.seq - 1, t.ts - 1, "RUNNING", "started"), (t.seq, t.ts, t.to_state, t.reason)]
        changes[t.run_id.encode()] = encode_state(state)
    for run_id, state in (dropped or {}).items():
        changes[run_id.encode()] = None if state is None else encode_state(state)
    store = index.store
    for key, value in changes.items():
        if value is None:
            store.pop(key, None)
        else:
            store[key] = value
    index.committed(changes)


def all_pages(indexes, **query) -> list[dict]:
    out, cursor = [], None
    while True:
        found, cursor = page(indexes, cursor=cursor, now_ms=10**7, **query)
        out += found
        if cursor is None:
            return out


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**32), st.sampled_from([1, 3, 50]), st.sampled_from([2, 5, 10**6]), st.sampled_from([0, 10**6]))
def test_pages_equal_a_sort_of_the_committed_runs(seed: int, limit: int, scan_max: int, bulk_min: int) -> None:
    """Random committed batches over 3 partitions (transitions, tombs, drops), read between batches or not,
    merged one by one or in bulk: every order and filter, paged at any size and scan budget, lists each held
    run once, in the order a full sort gives."""
    rnd = random.Random(seed)
    was, readmodel.BULK_MIN = readmodel.BULK_MIN, bulk_min
    try:
        _pages_equal_a_sort(rnd, limit, scan_max)
    finally:
        readmodel.BULK_MIN = was


def _pages_equal_a_sort(rnd: random.Random, limit: int, scan_max: int) -> None:
    indexes = {p: RunsIndex({}) for p in range(3)}
    truth: dict[str, tuple] = {}
    seqs: dict[str, int] = {}
    for _batch in range(rnd.randint(1, 12)):
        per_p: dict[int, tuple[list, dict]] = {p: ([], {}) for p in indexes}
        for _ in range(rnd.randint(0, 15)):
            run_id = f"run-{rnd.randint(0, 30):02d}"
            p = int(run_id[-2:]) % 3
            if rnd.random() < 0.15:
                per_p[p][1][run_id] = None if rnd.random() < 0.5 else RunState(run_id=run_id, seq=3, tomb=True)
                truth.pop(run_id, None)
                continue
            seqs[run_id] = seqs.get(run_id, 0) + 1
            t = transition(run_id, rnd.randint(0, 50), rnd.choice(STATES), rnd.choice(AGENTS), seqs[run_id])
            per_p[p][0].append(t)
            per_p[p][1].pop(run_id, None)
            truth[run_id] = (t.ts, run_id, t.to_state, t.agent, p)
        for p, (ts, live) in per_p.items():
            commit(indexes[p], ts, live)
            if rnd.random() < 0.5:
                len(indexes[p])  # a read between batches merges what was committed so far
    for state in (None, "STUCK"):
        for agent in (None, "coder"):
            rows = [v for v in truth.values() if (state is None or v[2] == state) and (agent is None or v[3] == agent)]
            by_id = all_pages(indexes, state=state, agent=agent, order="id", limit=limit, scan_max=scan_max)
            assert [r["run_id"] for r in by_id] == [v[1] for v in sorted(rows, key=lambda v: (v[4], v[1]))]
            by_age = all_pages(indexes, state=state, agent=agent, order="age", limit=limit, scan_max=scan_max)
            assert [(r["since_ts"], r["run_id"]) for r in by_age] == sorted((v[0], v[1]) for v in rows)
            assert [(r["partition"], r["state"]) for r in by_age] == [(truth[r["run_id"]][4], truth[r["run_id"]][2]) for r in by_age]


def test_a_page_is_short_when_its_scan_budget_ends_and_goes_on() -> None:
    """A filter that matches little cannot make one page walk the whole index: the page stops after
    scan_max entries with a cursor, and the next page goes on from there."""
    index = RunsIndex({})
    commit(index, [transition(f"r{i:03d}", i, "RUNNING", "a", 1) for i in range(100)]
           + [transition("r999", 5, "RUNNING", "rare", 1)])
    found, cursor = page({0: index}, state=None, agent="rare", order="id", cursor=None, limit=10, now_ms=0, scan_max=30)
    assert found == [] and cursor == (0, "r029")
    assert [r["run_id"] for r in all_pages({0: index}, state=None, agent="rare", order="age", limit=10, scan_max=30)] == ["r999"]


def test_a_run_entry_says_since_when_in_ms_and_iso_and_for_how_long() -> None:
    """Each listed run carries since_ts (ms), since (ISO-8601 UTC), in_state_s and the last reason."""
    index = RunsIndex({})
    commit(index, [transition("r", 1_764_601_526_123, "STUCK", "a", 3, "inactivity_timeout")])
    [doc], _ = page({4: index}, state=None, agent=None, order="id", cursor=None, limit=5, now_ms=1_764_601_586_123)
    assert doc == {"run_id": "r", "state": "STUCK", "seq": 3, "agent": "a", "since_ts": 1_764_601_526_123,
                   "since": "2025-12-01T15:05:26.123Z", "in_state_s": 60, "reason": "inactivity_timeout",
                   "partition": 4}
    assert iso(10**18) is None  # beyond datetime's range: the ms alone


def test_cursors_round_trip_and_a_cursor_of_the_other_order_is_refused() -> None:
    """A cursor decodes only for the order that gave it; anything else is None (the route answers 400)."""
    assert decode_cursor(encode_cursor((3, "r1")), "id") == (3, "r1")
    assert decode_cursor(encode_cursor(("age", 17, "r1")), "age") == ("age", 17, "r1")
    assert decode_cursor(encode_cursor(("age", 17, "r1")), "id") is None
    assert decode_cursor(encode_cursor((3, "r1")), "age") is None
    for bad in ("bm9wZQ", "", "!!", encode_cursor((True, "x")), encode_cursor((-1, "x"))):
        assert decode_cursor(bad, "id") is None


def test_an_index_nobody_reads_keeps_no_slot_per_changed_run() -> None:
    """Past max(BULK_MIN, half the listed runs) changes since the last read the index keeps none of them; the next
    read lists the whole store anew (its own key objects), in the order a full sort gives, and keeps count again."""
    rnd = random.Random(5)
    index = RunsIndex({})
    truth: dict[str, tuple] = {}
    for start in range(0, 3000, 250):  # 3,000 runs, never read
        batch = []
        for i in range(start, start + 250):
            t = transition(f"run-{i:05d}", rnd.randint(0, 10**6), rnd.choice(STATES), rnd.choice(AGENTS), 1)
            batch.append(t)
            truth[t.run_id] = (t.ts, t.run_id, t.to_state)
        commit(index, batch)
    assert index.stale and not index.pending
    by_age = all_pages({0: index}, state=None, agent=None, order="age", limit=500, scan_max=10**6)
    assert [(r["since_ts"], r["run_id"], r["state"]) for r in by_age] == sorted(truth.values())
    assert not index.stale and len(index) == 3000
    store_keys = {id(k) for k in index.store}
    assert all(id(k) in store_keys for ids in index._by_id.values() for k in ids)
    # Read once: up to half the listed runs are kept as pending changes, one more and none are.
    commit(index, [transition(f"run-{i:05d}", 7, "STUCK", None, 2) for i in range(1500)])
    assert not index.stale and len(index.pending) == 1500
    commit(index, [transition("run-new", 8, "FAILED", None, 1)])
    assert index.stale and not index.pending
    for i in range(1500):
        truth[f"run-{i:05d}"] = (7, f"run-{i:05d}", "STUCK")
    stuck = all_pages({0: index}, state="STUCK", agent=None, order="id", limit=1000, scan_max=10**6)
    assert [r["run_id"] for r in stuck] == sorted(r for r, v in truth.items() if v[2] == "STUCK")
    assert len(index) == 3001 and index.get("run-new").state == "FAILED"
