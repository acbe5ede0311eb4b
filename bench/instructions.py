"""Bench i: the worker's instructions per event on a real broker, counted, not timed.

Apps of bench e (by default the worker and the worker with each of its two recovery policies) each
consume the same preloaded backlogs under ``valgrind --tool=cachegrind --cache-sim=no``, which counts
the instructions the process executes (user space: the interpreter, msgspec, aiokafka, the event loop).
A small backlog once and a large one each round (the apps' order rotating), each run from its start to its
end offsets; the difference of the two counts (the large one's median) over the difference of their events
is the instructions of one more event, without the startup (imports, the group join) that both pay once.
The worker's session timeout is raised to 120 s, since a batch folded under cachegrind takes seconds; a
count whose worker rebalanced anyway (it restored its partitions twice) is refused, not reported.

Why: on a shared machine a worker's rate moves 5 % and more from round to round (bench e's readings of one
pair spread 0.90-1.13x in a day), which hides a 2-5 % difference; the counts of one app stay within ~1 % by
round (the event loop's turns while it waits on the broker vary). What they leave out: time the processor
waits on memory, the kernel's work (system time) and the broker's. Bench e stays the measure of rate; this
one says how much of a rate difference is the code's.
"""

from __future__ import annotations

import asyncio
import re
import shutil
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from aiokafka.admin import AIOKafkaAdminClient

from bench.common import Report, median, progress
from bench.ingest import (Backlog, _committed, _tail, preload, spawn, start_broker, stop, wait_ready,
                          worker_env)
from dev.localkafka import free_port

BENCH = "i instructions"
APPS = ("worker", "worker-recovery-docs", "worker-recovery")
READY_TIMEOUT_S = 300.0  # the worker starts ~15x slower under cachegrind
DONE_TIMEOUT_S = 1200.0
_SUMMARY = re.compile(rb"^summary:\s+(\d+)", re.M)  # cachegrind's output file: total instructions (Ir)


@dataclass
class Count:
    app: str
    events: int
    instructions: int


def instructions_of(out_file: Path) -> int:
    """The total instructions (Ir) a cachegrind output file records; ValueError naming the file if none."""
    found = _SUMMARY.search(out_file.read_bytes())
    if found is None:
        raise ValueError(f"{out_file}: no 'summary:' line (cachegrind stopped before writing it?)")
    return int(found.group(1))


def per_event(small: Count, large: Count) -> float:
    """Instructions of one more event: the two counts' difference over their events' difference."""
    if large.events <= small.events:
        raise ValueError(f"the large backlog ({large.events} events) must hold more than the small one ({small.events})")
    return (large.instructions - small.instructions) / (large.events - small.events)


async def _count(app: str, backlog: Backlog, rdir: Path) -> Count:
    """``app`` under cachegrind from ``backlog``'s start to its end offsets, then stopped (SIGTERM)."""
    tag = uuid.uuid4().hex[:8]
    group = f"instr-{app}-{tag}"
    adir = rdir / f"{app}-{tag}"
    adir.mkdir(parents=True)
    port = free_port()
    out_file = adir / "cachegrind.out"
    argv = ["valgrind", "--tool=cachegrind", "--cache-sim=no", f"--cachegrind-out-file={out_file}",
            sys.executable, "-m", "loopwarden.cli", "worker"]
    log = adir / "app.log"
    env = worker_env(app, backlog, group, tag, adir, port)
    env["LOOPWARDEN_SESSION_TIMEOUT_S"] = "120"
    proc = spawn(argv, env, log)
    admin = AIOKafkaAdminClient(bootstrap_servers=backlog.bootstrap)
    await admin.start()
    try:
        t0 = time.monotonic()
        await wait_ready(f"{app} under cachegrind", proc, port, log, t0, READY_TIMEOUT_S, poll_s=0.5)
        while await _committed(admin, group, backlog) < backlog.n:
            if proc.poll() is not None:
                raise RuntimeError(f"{app} exited with {proc.returncode}; {log}:\n{_tail(log)}")
            if time.monotonic() - t0 > DONE_TIMEOUT_S:
                raise TimeoutError(f"{app} under cachegrind not done after {DONE_TIMEOUT_S:.0f}s; {log}:\n{_tail(log)}")
            await asyncio.sleep(0.5)
    finally:
        await admin.close()
        stop(proc, grace_s=120.0)  # cachegrind writes its file as the worker exits
    if log.read_text(errors="replace").count(" recovered in ") > 1:
        raise RuntimeError(f"{app} rebalanced under cachegrind (its partitions recovered twice): not counted; {log}")
    return Count(app, backlog.n, instructions_of(out_file))


async def _all(workdir: Path, events: int, apps: tuple[str, ...], rounds: int) -> dict[str, tuple[float, list[int]]]:
    """Per app: instructions per event and the large backlog's count by round."""
    broker = start_broker(workdir / "instr-kafka")
    try:
        small = await preload(broker.bootstrap, max(events // 10, 1_000), seed=11)
        large = await preload(broker.bootstrap, events, seed=11)
        progress(f"[i] backlogs of {small.n:,} and {large.n:,} messages")
        first: dict[str, Count] = {}
        for app in apps:
            first[app] = await _count(app, small, workdir / "instr")
            progress(f"[i]   {app}: {first[app].instructions:,} instructions over {small.n:,} events")
        counts: dict[str, list[int]] = {app: [] for app in apps}
        for i in range(rounds):
            for app in apps[i % len(apps):] + apps[:i % len(apps)]:
                count = await _count(app, large, workdir / "instr")
                progress(f"[i]   round {i + 1}/{rounds} {app}: {count.instructions:,} instructions over {large.n:,} events")
                counts[app].append(count.instructions)
        return {app: (per_event(first[app], Count(app, large.n, round(median(c)))), c) for app, c in counts.items()}
    finally:
        broker.stop()


def instructions(report: Report, workdir: Path, events: int = 100_000, apps: tuple[str, ...] = APPS,
                 rounds: int = 3) -> None:
    if shutil.which("valgrind") is None:
        progress("[i] not run: valgrind not found (Debian's valgrind package: `make valgrind`)")
        report.add(BENCH, "worker instructions per event", "not run", "valgrind not found: `make valgrind`")
        return
    progress(f"[i] {', '.join(apps)} under cachegrind, {events:,} events ...")
    try:
        per = asyncio.run(_all(workdir, events, apps, rounds))
    except (RuntimeError, TimeoutError, OSError, ValueError) as exc:
        progress(f"[i]   FAILED: {exc}")
        report.add(BENCH, "worker instructions per event", "failed", str(exc).splitlines()[0])
        return
    base = per[apps[0]][0]
    for app in apps:
        value, by_round = per[app]
        spread = f"large backlog {min(by_round) / 1e9:.2f}-{max(by_round) / 1e9:.2f} G by round"
        note = f"user space, on the broker, startup taken out; {spread}"
        if app != apps[0]:
            note = f"{value / base:.3f}x {apps[0]}'s; {spread}"
            if app == "worker-recovery-docs":
                note += " (bench e's rate target for it is >= 0.95x)"
        report.add(BENCH, f"{app}: instructions per event", f"{value:,.0f}", note)
