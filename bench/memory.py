"""Bench b2: what a worker holds per run, without Kafka: the fold's own memory, as RSS and as Python heap.

Each figure comes from a fresh interpreter (``python -m bench.memory child ...``) so
nothing else of the bench is in its RSS. The child folds a simulated fleet through
eight :class:`PartitionTask` over memory stores, round-robin in batches with the store
written and ``committed`` called per batch, as the worker does; the collector set as
the worker sets it (``gctune``, then ``gc.freeze`` as after a recovery). Then:

* **RSS per run**, at two fleet sizes and two batch sizes (2,500, and 300 as the worker's
  transactions are under load), partitions round-robin: the slope between them is what one more run
  costs (``marginal``); RSS / runs at one size also carries the interpreter's
  fixed cost and whatever the allocator keeps of the fold's garbage. Read before and
  after ``malloc_trim(0)`` (the worker calls it every ``malloc_trim_s``).
* **Python heap per run** (tracemalloc), split into the store (dict of encoded states),
  the timer queue (its run keys are the store's own objects: counted with the store), the
  read index of ``/runs`` (a set slot per run until a read merges it) and the rest; then
  the same after one read of every partition's index (merged: ordered lists, one int
  per run), and the RSS slope of a worker whose ``/runs`` was read (``read``).

The Kafka bench's figure (RSS at the end minus RSS at ready, over the runs held) is an
average over one fleet size: it also holds the Kafka clients' buffers, which do not
grow with runs; bench c reports its own marginal figure beside it.
"""

from __future__ import annotations

import gc
import json
import os
import pickle
import subprocess
import sys
import tempfile
import tracemalloc

from bench.common import Report, nbytes, progress, rss_kb

BENCH = "b state"


def _inputs(runs: int, path: str) -> None:
    """Write a fleet's valid messages, as (partition, topic, offset, key, value) per partition, to ``path``."""
    from bench.core import valid_messages
    from loopwarden.engine.assignment import partition_of

    by_partition: dict[int, list] = {}
    offsets: dict[tuple[str, int], int] = {}
    for m in valid_messages(runs, seed=23):
        p = partition_of(m.key, 8)
        off = offsets.get((m.topic, p), 0)
        offsets[m.topic, p] = off + 1
        by_partition.setdefault(p, []).append((m.topic, off, m.key, m.value))
    with open(path, "wb") as f:
        pickle.dump(by_partition, f)


def _fold(path: str, trace: bool, batch: int = 2500, read: bool = False) -> dict:
    from bench.core import _Rec
    from loopwarden import gctune
    from loopwarden.rules import Settings
    from loopwarden.engine.memory import trim
    from loopwarden.engine.store import MemoryPartition
    from loopwarden.stages.health.task import PartitionTask

    # Read from a file, not simulated here: the simulation's garbage would leave free slots in
    # pymalloc's arenas that the fold reuses, and RSS would not show the runs.
    with open(path, "rb") as f:
        raw = pickle.load(f)
    by_partition = {p: [_Rec(t, p, off, k, v) for t, off, k, v in items] for p, items in raw.items()}
    del raw
    gctune.for_streaming()
    roles = {"steps": "steps", "outcomes": "outcomes", "ticks": "ticks"}
    gc.collect()
    trim()
    if trace:
        tracemalloc.start()
    rss0 = rss_kb(_pid())["VmRSS"] * 1024
    heap0 = tracemalloc.get_traced_memory()[0] if trace else 0
    tasks = {p: PartitionTask(p, MemoryPartition(), roles, settings=Settings(), clock="event") for p in by_partition}
    # Round-robin over the partitions, ``batch`` records each: as the worker's pipelines interleave.
    longest = max(map(len, by_partition.values()))
    for i in range(0, longest, batch):
        for p, records in by_partition.items():
            if i < len(records):
                task = tasks[p]
                out = task.fold(records[i:i + batch], punctuate=True)
                task.store.write(out.changes, None)
                task.committed(out)
                del out
    tasks = list(tasks.values())
    held = sum(sum(t.state_counts.values()) for t in tasks)
    if read:  # a /runs read: each index merges what was committed
        for t in tasks:
            len(t.index)
    # The inputs stay held until the end: freed, their pages would be reused for the runs and hide them.
    gc.collect()
    gc.freeze()
    out = {"runs": held, "rss": rss_kb(_pid())["VmRSS"] * 1024 - rss0}
    trim()
    out["rss_trimmed"] = rss_kb(_pid())["VmRSS"] * 1024 - rss0
    if trace:
        out["heap"] = tracemalloc.get_traced_memory()[0] - heap0
        out["timers"] = sum(t.timers.nbytes(keys=False) for t in tasks)  # its keys are the store's
        out["store"] = sum(_store_bytes(t.store) for t in tasks)
        out["index"] = sum(sys.getsizeof(t.index.pending) for t in tasks)
        before = tracemalloc.get_traced_memory()[0]
        for t in tasks:
            len(t.index)  # a read merges it
        gc.collect()
        out["index_read"] = tracemalloc.get_traced_memory()[0] - before + out["index"]
        tracemalloc.stop()
    by_partition.clear()
    return out


def _pid() -> int:
    return os.getpid()


def _deep(objs) -> int:
    """Bytes of the given objects and of the containers' direct items (not shared singletons)."""
    return sum(sys.getsizeof(o) for o in objs)


def _store_bytes(store) -> int:
    data = dict(store.items())  # a copy of the same size: the store's own dict is private
    return sys.getsizeof(data) + _deep(data.keys()) + _deep(data.values())


def _child(path: str, trace: bool, batch: int = 2500, read: bool = False) -> dict:
    cmd = ([sys.executable, "-m", "bench.memory", "child", path, str(batch)] + (["--trace"] if trace else [])
           + (["--read"] if read else []))
    done = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def fold_memory(report: Report, small: int, large: int) -> dict:
    """Report RSS per run held (marginal and average, before/after malloc_trim) and the heap split."""
    progress(f"[b] worker fold memory: {small:,} and {large:,} runs, fresh interpreters ...")
    with tempfile.TemporaryDirectory(prefix="loopwarden-memory-") as tmp:
        paths = {n: os.path.join(tmp, f"fleet-{n}.pickle") for n in (small, large)}
        for n, path in paths.items():
            _inputs(n, path)
        a, b = _child(paths[small], False), _child(paths[large], False)
        t = _child(paths[large], True)
        a300, b300 = _child(paths[small], False, 300), _child(paths[large], False, 300)
        a_read, b_read = _child(paths[small], False, read=True), _child(paths[large], False, read=True)
    slope = (b["rss"] - a["rss"]) / (b["runs"] - a["runs"])
    slope_trim = (b["rss_trimmed"] - a["rss_trimmed"]) / (b["runs"] - a["runs"])
    report.add(BENCH, "worker fold: RSS per run held, marginal", nbytes(slope_trim),
               f"slope between {a['runs']:,} and {b['runs']:,} runs after malloc_trim; {nbytes(slope)} before it; "
               f"8 PartitionTasks, memory store, no Kafka; target <= 600 B")
    slope300 = (b300["rss_trimmed"] - a300["rss_trimmed"]) / (b300["runs"] - a300["runs"])
    report.add(BENCH, "  same, batches of 300", nbytes(slope300),
               f"slope, after malloc_trim; as the worker's transactions under load (100-400 records each): each "
               f"batch re-encodes the state of every run it touches, more often with smaller batches")
    slope_read = (b_read["rss_trimmed"] - a_read["rss_trimmed"]) / (b_read["runs"] - a_read["runs"])
    report.add(BENCH, "  same, /runs read (index merged)", nbytes(slope_read),
               "slope, after malloc_trim, batches of 2,500; every partition's read index merged at the end, "
               "as after one GET /runs")
    report.add(BENCH, "worker fold: RSS / runs held (average)", nbytes(b["rss_trimmed"] / b["runs"]),
               f"{b['runs']:,} runs, after malloc_trim; {nbytes(b['rss'] / b['runs'])} before it")
    n = t["runs"]
    report.add(BENCH, "worker fold: Python heap per run held", nbytes(t["heap"] / n),
               f"tracemalloc; store {nbytes(t['store'] / n)} (run keys included), timer queue {nbytes(t['timers'] / n)}, "
               f"read index {nbytes(t['index'] / n)}, rest {nbytes((t['heap'] - t['store'] - t['timers'] - t['index']) / n)}; "
               f"the read index once read: {nbytes(t['index_read'] / n)}")
    return {"marginal": slope_trim, "marginal300": slope300, "marginal_read": slope_read,
            "average": b["rss_trimmed"] / b["runs"], "heap": t["heap"] / n}


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "child":
        print(json.dumps(_fold(sys.argv[2], "--trace" in sys.argv, int(sys.argv[3]), "--read" in sys.argv)))
    else:
        r = Report("memory")
        fold_memory(r, 10_000, 40_000)
        for row in r.rows:
            print(f"{row.figure:<45} {row.value:>10}  {row.note}")
