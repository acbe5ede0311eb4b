"""The read API's index (loopwarden.api.readmodel) against the scan it replaced.

``python -m bench.readindex [--runs N]``: one partition holding N runs (encoded states, as the
store holds them). Prints what the consuming loop pays per committed transition (the feed), what
a read pays to merge what changed, a page of /runs (1000 runs; all, one state, order=age) by the
index and by the old scan (sort every key, decode until the page is full), and the index's heap
per run (tracemalloc). Figures, not assertions.
"""

from __future__ import annotations

import argparse
import bisect
import random
import time
import tracemalloc

from loopwarden import gctune
from loopwarden.codecs import STATES
from loopwarden.rules import RunState, decode_state, encode_state
from loopwarden.api.pages import page
from loopwarden.api.readmodel import RunsIndex


def states(n: int, rnd: random.Random) -> list[RunState]:
    out = []
    for i in range(n):
        s = RunState(run_id=f"run-{rnd.getrandbits(48):012x}-{i}", health=rnd.choice(STATES), seq=3,
                     agent=f"agent-{i % 20}", last_seen_ts=1_700_000_000_000 + i)
        s.history = [(3, 1_700_000_000_000 + rnd.randrange(10**9), s.health, "stop_condition")]
        out.append(s)
    return out


def old_scan(store: dict, state: str | None, limit: int) -> list:
    """What PartitionTask.runs_page did per page: sort all keys, decode from the start until full."""
    keys = sorted(store)
    start = bisect.bisect_right(keys, b"")
    found = []
    for key in keys[start:]:
        s = decode_state(store[key], key.decode())
        if state is not None and s.health != state:
            continue
        found.append(s.run_id)
        if len(found) >= limit:
            break
    return found


def timed(fn, repeat: int = 5) -> float:
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=200_000)
    n = ap.parse_args().runs
    gctune.for_streaming()  # the collector thresholds the worker runs with
    rnd = random.Random(1)
    held = states(n, rnd)
    store = {s.run_id.encode(): encode_state(s) for s in held}

    t = time.perf_counter()
    index = RunsIndex(store)
    for key, s in zip(store, held):
        index.add(key, s)  # during PartitionTask.rebuild, beside the timers
    added = time.perf_counter() - t
    t = time.perf_counter()
    len(index)  # the first read merges it all at once
    built = time.perf_counter() - t
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    index = RunsIndex(store)
    for key, s in zip(store, held):
        index.add(key, s)
    len(index)
    per_run = (tracemalloc.get_traced_memory()[0] - before) / n
    tracemalloc.stop()

    changes = {}
    for i in range(5000):  # 5,000 committed transitions: their new states written to the store
        s = held[rnd.randrange(n)]
        s.health = rnd.choice(STATES)
        s.history = [(4, 1_800_000_000_000 + i, s.health, "late_receipt")]
        changes[s.run_id.encode()] = store[s.run_id.encode()] = encode_state(s)
    feed = timed(lambda: index.committed(changes), 20) / len(changes)
    t = time.perf_counter()
    len(index)
    merge = (time.perf_counter() - t) / len(changes)

    q = dict(agent=None, cursor=None, limit=1000, now_ms=1_900_000_000_000)
    rows = [
        ("page, all states (id order)", timed(lambda: page({0: index}, state=None, order="id", **q)),
         timed(lambda: old_scan(store, None, 1000), 3)),
        ("page, state=STUCK", timed(lambda: page({0: index}, state="STUCK", order="id", **q)),
         timed(lambda: old_scan(store, "STUCK", 1000), 3)),
        ("page, order=age", timed(lambda: page({0: index}, state=None, order="age", **q)), None),
    ]
    print(f"runs held: {n}")
    print(f"after a restore: add {added / n * 1e9:.0f} ns per run, first read builds the lists in {built * 1000:.0f} ms")
    print(f"feed on the hot path: {feed * 1e9:.0f} ns per committed transition")
    print(f"merge at the next read: {merge * 1e6:.2f} us per changed run")
    print(f"index heap: {per_run:.0f} B per run")
    for name, new, old in rows:
        print(f"{name:<30} index {new * 1000:8.2f} ms" + (f"   old scan {old * 1000:8.1f} ms" if old else ""))


if __name__ == "__main__":
    main()
