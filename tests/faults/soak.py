"""`make soak`: a worker under steady load with bursts for N minutes (30 by default).

A local broker, one worker (memory store, wall clock, short timers, retention and seq memory so
that the number of runs held levels off), a publisher at a steady event rate with a burst every
few minutes. Sampled every 10 s: the worker's RSS, runs held, consumer lag, stalls. Printed at the
end, with a verdict: RSS growth after warm-up (the first warmup_s and the first burst) < 10 %, no stall, lag back to its steady level (under a second of the rate) after every burst,
the worker alive. Exit status 1 if any fails.

    python -m tests.faults.soak --minutes 30 --events-per-s 8000
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from bench.common import rss_kb
from dev.localkafka import LocalKafka
from loopwarden.publisher import Publisher
from loopwarden.simulate import fleet
from loopwarden.stages.topics import ensure_topics
from tests.integration.harness import make_worker, unique_config

EVENTS_PER_RUN = 6.5
# Inactivity 5 s, receipt window 1 s: the simulator's approval deadlines are 100 windows (100 s), so
# every run settles within ~2 min and, with retention and seq memory of 60 s, the runs held level off
# after ~4 min (with the defaults of 300/600 s, WAITING runs pile up for 17 hours).
TIMERS_S = (5.0, 1.0)


def _metrics(worker) -> dict[str, float]:
    status, body = worker.get("/metrics")
    out: dict[str, float] = {}
    if status != 200:
        return out
    for family in text_string_to_metric_families(body.decode()):
        for s in family.samples:
            if s.name in ("loopwarden_consumer_lag", "loopwarden_runs", "loopwarden_stalls_total",
                          "loopwarden_events_total", "loopwarden_invalid_events_total"):
                out[s.name] = out.get(s.name, 0.0) + s.value
    return out


async def _steady(config, runs_per_s: float, until: float, seed: int) -> int:
    """Fleets published as their events happen (each at its ts), until ``until`` (monotonic)."""
    sent = 0
    topics = {"steps": config.steps_topic, "outcomes": config.outcomes_topic}
    async with Publisher(config.bootstrap, config.steps_topic, config.outcomes_topic) as pub:
        while time.monotonic() < until:
            start = int(time.time() * 1000)
            t0 = time.monotonic()
            batch = fleet(int(runs_per_s * 30), seed=seed, start_ms=start, rate=runs_per_s, timers_s=TIMERS_S)
            seed += 1
            for m in batch:
                if m.ts - start > 30_000 or time.monotonic() >= until:
                    break  # the next fleet takes over (its tail would overlap)
                delay = (m.ts - start) / 1000 - (time.monotonic() - t0)
                if delay > 0:
                    await asyncio.sleep(delay)
                await pub.publish_raw(topics[m.topic], m.key, m.value)
                sent += 1
                if sent % 200 == 0:
                    await asyncio.sleep(0)  # behind the pace it would never yield: the sampler must run
        await pub.flush()
    return sent


async def _burst(config, events: int, seed: int) -> int:
    """``events`` published as fast as possible, stamped so the last is now."""
    runs = int(events / EVENTS_PER_RUN)
    now = int(time.time() * 1000)
    batch = fleet(runs, seed=seed, start_ms=now, timers_s=TIMERS_S)
    shift = max(m.ts for m in batch) - now
    batch = fleet(runs, seed=seed, start_ms=now - shift, timers_s=TIMERS_S)
    topics = {"steps": config.steps_topic, "outcomes": config.outcomes_topic}
    async with Publisher(config.bootstrap, config.steps_topic, config.outcomes_topic) as pub:
        for m in batch:
            await pub.publish_raw(topics[m.topic], m.key, m.value)
        await pub.flush()
    return len(batch)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.faults.soak", description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=30.0)
    ap.add_argument("--events-per-s", type=float, default=8000.0, help="steady rate (default 8000)")
    ap.add_argument("--burst-every-s", type=float, default=300.0)
    ap.add_argument("--burst-events", type=int, default=50_000)
    ap.add_argument("--warmup-s", type=float, default=None, help="default: a quarter of the run, at most 5 min")
    ap.add_argument("--worker-setting", action="append", default=[], metavar="NAME=VALUE",
                    help="a worker Config field for this soak, e.g. batch_max_records=5000 (repeatable)")
    args = ap.parse_args(argv)
    total_s = args.minutes * 60
    warmup_s = args.warmup_s if args.warmup_s is not None else min(300.0, total_s / 4)
    work = Path(tempfile.mkdtemp(prefix="loopwarden-soak-"))
    broker = LocalKafka(work / "kafka", heap="768m").start(timeout_s=120)
    config = unique_config(broker.bootstrap, partitions=8)
    from dataclasses import fields

    from loopwarden.config import Config

    types = {f.name: f.type for f in fields(Config)}
    settings: dict = {}
    for item in args.worker_setting:
        name, _, raw = item.partition("=")
        if name not in types:
            ap.error(f"--worker-setting {item!r}: no Config field {name!r}")
        settings[name] = int(raw) if "int" in str(types[name]) else float(raw) if "float" in str(types[name]) else raw
    worker = make_worker(config, work, clock="wall", retention_s=60.0, seq_memory_s=60.0, **settings).start()
    samples: list[dict] = []
    bursts: list[dict] = []
    ok = True
    try:
        asyncio.run(ensure_topics(worker.config))
        assert worker.proc is not None
        pid = worker.proc.pid
        t0 = time.monotonic()
        end = t0 + total_s

        # Under steady load the lag is never exactly 0 when sampled: a burst is drained once the lag is
        # back under one second of the steady rate.
        steady_lag = max(1000.0, args.events_per_s)

        async def drive() -> int:
            steady = asyncio.create_task(_steady(worker.config, args.events_per_s / EVENTS_PER_RUN, end, seed=1000))
            next_burst = t0 + args.burst_every_s
            pending_burst: dict | None = None
            while time.monotonic() < end:
                await asyncio.sleep(10)
                now = time.monotonic()
                m = await asyncio.to_thread(_metrics, worker)
                sample = {"t_s": round(now - t0), "rss_kib": rss_kb(pid).get("VmRSS", 0), "runs": m.get("loopwarden_runs", 0),
                          "lag": m.get("loopwarden_consumer_lag", 0), "stalls": m.get("loopwarden_stalls_total", 0),
                          "events": m.get("loopwarden_events_total", 0)}
                samples.append(sample)
                print(json.dumps(sample), flush=True)
                if worker.proc.poll() is not None:
                    raise RuntimeError(f"worker exited: {worker.log_tail()}")
                if pending_burst is not None and sample["lag"] <= steady_lag:
                    pending_burst["lag_drained_s"] = round(now - pending_burst["at"], 1)
                    pending_burst["drained_t_s"] = sample["t_s"]
                    pending_burst = None
                if now >= next_burst and now + 60 < end and pending_burst is None:
                    n = await _burst(worker.config, args.burst_events, seed=len(bursts) + 1)
                    pending_burst = {"at": time.monotonic(), "events": n, "before_t_s": sample["t_s"]}
                    bursts.append(pending_burst)
                    next_burst = now + args.burst_every_s
            return await steady

        sent = asyncio.run(drive())
        # Warm-up: the first warmup_s and the first burst, until drained. A bursty load's steady state
        # includes a burst: the first one sets the allocator's high-water mark (the batch in flight,
        # fetched records), which later bursts reuse; growth after it is what a leak would show.
        warm_end = max([warmup_s] + [b["drained_t_s"] for b in bursts[:1] if "drained_t_s" in b])
        warm = [s for s in samples if s["t_s"] >= warm_end]
        base, last = (warm[0], warm[-1]) if warm else (samples[0], samples[-1])
        growth = (last["rss_kib"] - base["rss_kib"]) / max(base["rss_kib"], 1)
        before = [s for s in samples if bursts and s["t_s"] <= bursts[0]["before_t_s"]]
        verdict = {
            "minutes": args.minutes, "steady_events_sent": sent, "steady_rate_eps": round(sent / total_s),
            "bursts": [{k: v for k, v in b.items() if k not in ("at", "before_t_s")} for b in bursts],
            "warmup_end_t_s": base["t_s"], "rss_before_first_burst_kib": before[-1]["rss_kib"] if before else None,
            "rss_after_warmup_kib": base["rss_kib"], "rss_end_kib": last["rss_kib"],
            "rss_max_after_warmup_kib": max(s["rss_kib"] for s in warm) if warm else None,
            "rss_growth_pct": round(100 * growth, 1), "runs_held": [base["runs"], last["runs"]],
            "stalls": last["stalls"], "worker_alive": worker.proc.poll() is None, "date": time.strftime("%Y-%m-%d"),
        }
        ok = (growth < 0.10 and last["stalls"] == 0 and verdict["worker_alive"]
              and all("lag_drained_s" in b for b in bursts))
        print("SOAK " + json.dumps(verdict), flush=True)
        print("soak: " + ("PASS" if ok else "FAIL"), flush=True)
    finally:
        worker.stop()
        broker.stop()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
