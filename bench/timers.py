"""Bench d: the cost of a timer tick with many runs held but few timers due.

Drives :class:`loopwarden.stages.health.task.PartitionTask` directly (a dict store per
partition, event-time clock, one tick record per partition), as the worker's loop
does (then writing the batch's changes to the store, as after a commit). Each round advances the clock by just enough for ``due`` timers to fire.
The O(runs) baseline decodes every table value and computes its deadline: what a
processor scanning its table on each tick would pay.
"""

from __future__ import annotations

import time

import msgspec

from bench.common import Report, duration, median, progress
from loopwarden.codecs import Policy, RunStarted, StepFinished, ToolCall
from loopwarden.rules import Settings, apply, decode_state, encode_state, next_deadline
from loopwarden.engine.store import MemoryPartition
from loopwarden.stages.health.task import PartitionTask, Tick, encode_tick, is_meta

PARTITIONS = 8
BASE_MS = 1_780_000_000_000
INACTIVITY_S = 300.0
GAP_MS = 1  # run i's deadline is BASE + i ms + the inactivity timeout


class _Rec:
    def __init__(self, partition: int, value: bytes) -> None:
        self.topic, self.partition, self.offset, self.key, self.value, self.headers = "ticks", partition, 0, None, value, ()


def _processor(runs: int) -> tuple[list[PartitionTask], list[MemoryPartition]]:
    """Partition tasks holding ``runs`` RUNNING runs whose deadlines are 1 ms apart."""
    policy = Policy(version="v1", inactivity_timeout_s=INACTIVITY_S)
    template = apply(None, RunStarted(run_id="t", ts=BASE_MS, agent="bench-agent", policy=policy), BASE_MS).state
    step = StepFinished(run_id="t", ts=BASE_MS, step=0, finish_reason="tool-calls",
                        tool_calls=(ToolCall(id="c", name="lookup", status="result"),))
    template = apply(template, step, BASE_MS).state
    stores = [MemoryPartition() for _ in range(PARTITIONS)]
    for i in range(runs):
        ts = BASE_MS + i * GAP_MS
        state = msgspec.structs.replace(template, run_id=f"run-{i:07d}", last_activity_ts=ts, last_seen_ts=ts)
        stores[i % PARTITIONS].write({state.run_id.encode(): encode_state(state)}, None)
    roles = {"steps": "steps", "outcomes": "outcomes", "ticks": "ticks"}
    tasks = [PartitionTask(p, stores[p], roles, settings=Settings(), clock="event") for p in range(PARTITIONS)]
    for task in tasks:
        task.rebuild()
    return tasks, stores


def _round(tasks: list[PartitionTask], now_ms: int) -> int:
    """One tick to every partition, then its changes written as after a commit; returns transitions."""
    value = encode_tick(Tick(now_ms=now_ms))
    n = 0
    for task in tasks:
        out = task.fold([_Rec(task.partition, value)])
        task.store.write(out.changes, None)
        task.committed(out)
        n += len(out.transitions)
    return n


def _rounds(proc: list[PartitionTask], start_ms: int, due: int, rounds: int) -> tuple[list[float], int, int]:
    """Seconds per round with ``due`` timers due each round; returns (times, fired, next start)."""
    times, fired, now = [], 0, start_ms
    for _ in range(rounds):
        now += due * GAP_MS
        t0 = time.perf_counter()
        fired += _round(proc, now)
        times.append(time.perf_counter() - t0)
    return times, fired, now


def _scan(stores: list[MemoryPartition]) -> float:
    settings = Settings()
    t0 = time.perf_counter()
    for store in stores:
        for key, raw in store.items():
            if not is_meta(key):
                next_deadline(decode_state(raw, key.decode()), settings)
    return time.perf_counter() - t0


def tick_cost(report: Report, sizes: tuple[int, ...], few: int, many: int, rounds: int) -> None:
    bench = "d timers"
    first_due = BASE_MS + int(INACTIVITY_S * 1000) - GAP_MS  # the clock just before run 0's deadline
    for runs in sizes:
        progress(f"[d] timers: {runs:,} runs in the table ...")
        proc, table = _processor(runs)
        _round(proc, first_due)  # nothing due: warms the code path
        t_idle, _, _ = _rounds(proc, first_due, 0, rounds)
        t_few, fired_few, now = _rounds(proc, first_due, few, rounds)
        left = runs - few * rounds
        due_many = min(many, left // 3)
        many_rounds = max(1, min(rounds, left // due_many))
        t_many, fired_many, _ = _rounds(proc, now, due_many, many_rounds)
        scan = median([_scan(table) for _ in range(3)])
        heap = sum(len(task.timers) for task in proc)
        note = f"{PARTITIONS} partitions"
        report.add(bench, f"{runs:,} runs: tick round, 0 due", duration(median(t_idle)), note)
        report.add(bench, f"{runs:,} runs: tick round, {few} due", duration(median(t_few)),
                   f"{duration(median(t_few) / few)}/timer; fired {fired_few:,}")
        report.add(bench, f"{runs:,} runs: tick round, {due_many:,} due", duration(median(t_many)),
                   f"{duration(median(t_many) / due_many)}/timer; fired {fired_many:,}")
        report.add(bench, f"{runs:,} runs: O(runs) table scan baseline", duration(scan),
                   f"{duration(scan / runs)}/run; {scan / median(t_few):.0f}x a {few}-due round; heap {heap:,}")
