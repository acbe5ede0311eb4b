"""Run every bench and print the figures side by side: ``python -m bench.run [--quick]``.

Progress goes to stderr; stdout gets a compact table, then the same figures as
Markdown (for bench/README.md). Medians over repeats; timings are never asserted.
"""

from __future__ import annotations

import argparse
import datetime
import shutil
import sys
import tempfile
import time
from pathlib import Path

from bench.common import Report, machine_note, progress

FULL = dict(core_runs=20_000, core_repeats=5, state_runs=20_000, heap_runs=10_000,
            kafka_runs=20_000, kafka_rounds=2, txn_count=200, paced_runs=300, paced_s=8, pace_eps=5000.0, timer_sizes=(5_000, 50_000), timer_rounds=200,
            ingest_events=600_000, ingest_rounds=3, ingest_warmup=1, latency_s=8.0, latency_rounds=3, warmup_runs=(2, 16),
            fold_memory_runs=(10_000, 40_000), instr_events=100_000, instr_rounds=3)
QUICK = dict(core_runs=5_000, core_repeats=3, state_runs=5_000, heap_runs=5_000,
             kafka_runs=1_000, kafka_rounds=1, txn_count=60, paced_runs=150, paced_s=4, pace_eps=5000.0, timer_sizes=(5_000, 50_000), timer_rounds=100,
             ingest_events=50_000, ingest_rounds=1, ingest_warmup=0, latency_s=4.0, latency_rounds=1, warmup_runs=(2, 2),
             fold_memory_runs=(5_000, 20_000), instr_events=20_000, instr_rounds=1)
BENCHES = ("core", "state", "timers", "txn", "ingest", "instr", "latency", "kafka", "verify", "otel")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller sizes, one Kafka round (about 2 minutes)")
    parser.add_argument("--only", choices=BENCHES, action="append",
                        help="run only this bench (repeatable); default all")
    parser.add_argument("--pace-eps", type=float, default=None,
                        help="rate of the kafka bench's paced (latency) phase; default half the ingest maximum")
    parser.add_argument("--apps", default=None,
                        help="the ingest bench's apps, comma-separated (default bare,decode,quix,quix1s,kstreams,engine,worker; "
                             "also faust, and worker-alt: the worker with --alt-env)")
    parser.add_argument("--alt-env", action="append", default=[], metavar="LOOPWARDEN_NAME=VALUE",
                        help="worker-alt's setting (repeatable): the worker with and without it, side by side")
    parser.add_argument("--rounds", type=int, default=None, help="the ingest bench's rounds (default 3, 1 with --quick)")
    parser.add_argument("--events", type=int, default=None, help="the ingest bench's backlog (default 600,000)")
    parser.add_argument("--keep", action="store_true", help="keep the broker and worker logs (path printed)")
    parser.add_argument("--profile", default="", metavar="DIR",
                        help="run the ingest bench's workers under cProfile, their stats into DIR (slower)")
    args = parser.parse_args(argv)
    size = QUICK if args.quick else FULL
    only = set(args.only or BENCHES)
    from bench import ingest as ingest_bench

    for pair in args.alt_env:
        key, sep, value = pair.partition("=")
        if not sep or not key.startswith("LOOPWARDEN_"):
            parser.error(f"--alt-env: {pair!r} is not LOOPWARDEN_NAME=VALUE")
        ingest_bench.ALT_ENV[key] = value
    ingest_bench.PROFILE_DIR = args.profile
    report = Report("loopwarden bench")
    started = time.monotonic()
    workdir = Path(tempfile.mkdtemp(prefix="loopwarden-bench-"))
    try:
        if "core" in only:
            from bench.core import throughput

            throughput(report, size["core_runs"], size["core_repeats"])
        if "state" in only:
            from bench.core import state_size

            state_size(report, size["state_runs"], size["heap_runs"])
            from bench.memory import fold_memory

            fold_memory(report, *size["fold_memory_runs"])
        if "timers" in only:
            from bench.timers import tick_cost

            tick_cost(report, size["timer_sizes"], few=10, many=5_000, rounds=size["timer_rounds"])
        if "txn" in only:
            from bench.txn import txn_floor

            txn_floor(report, workdir, txns=size["txn_count"])
        maxima: dict[str, float] = {}
        if "ingest" in only:
            from bench.ingest import ingest

            from bench import ingest as ingest_bench

            apps = tuple(args.apps.split(",")) if args.apps else ingest_bench.APPS
            known = ingest_bench.APPS + ingest_bench.EXTRA_APPS
            unknown = set(apps) - set(known)
            if unknown:
                parser.error(f"--apps: unknown {sorted(unknown)}; known: {','.join(known)}")

            maxima = ingest(report, workdir, args.events or size["ingest_events"], args.rounds or size["ingest_rounds"],
                             apps=apps, warmup=size["ingest_warmup"])
        if "instr" in only:  # the same worker apps counted under cachegrind: what of a rate difference is the code's
            from bench.instructions import APPS as INSTR_APPS, instructions

            workers = tuple(a for a in (args.apps or "").split(",") if a.startswith("worker")) or INSTR_APPS
            countable = ("worker", "worker-alt", *ingest_bench.POLICIES)
            unknown = set(workers) - set(countable)
            if unknown:
                parser.error(f"--apps: bench i counts {', '.join(countable)}, not {sorted(unknown)}")
            instructions(report, workdir, size["instr_events"], workers, rounds=args.rounds or size["instr_rounds"])
        max_eps = maxima.get("worker")
        if "latency" in only:
            from bench.latency import latency

            # One rate for every app: half the slowest one's maximum (Quix at its defaults), so each keeps up;
            # and the worker again at half its own maximum.
            slowest = min((maxima[a] for a in ("quix", "quix1s", "worker") if a in maxima), default=None)
            rate = args.pace_eps or (slowest / 2 if slowest else size["pace_eps"])
            latency(report, workdir, rate, max_eps / 2 if max_eps else None, measure_s=size["latency_s"],
                    only=set(args.apps.split(",")) if args.apps and "ingest" not in only else None,
                    rounds=args.rounds if "ingest" not in only and args.rounds else size["latency_rounds"],
                    warmup_runs=size["warmup_runs"])
        if "kafka" in only:
            from bench.kafka import processor_e2e

            # Latency is read at half the worker's measured maximum (ingest bench), as the issue asks.
            pace = args.pace_eps or (max_eps / 2 if max_eps else size["pace_eps"])
            processor_e2e(report, workdir, size["kafka_runs"], size["kafka_rounds"], partitions=4,
                          paced_runs=max(size["paced_runs"], int(pace * size["paced_s"] / 6.5)), pace_eps=pace)
        if "verify" in only:  # checks/s of `loopwarden verify`, signature checks in the worker's fold
            from bench.verify import verify_rows

            verify_rows(report, quick=args.quick)
        if "otel" in only:  # spans/s through the OpenTelemetry bridge against bare decoding and the worker
            from bench.otel import otel_rows
            from bench.otel_kafka import otel_collector, otel_kafka

            otel_rows(report, quick=args.quick)
            otel_kafka(report, workdir, runs=2000 if args.quick else 5000, rounds=1 if args.quick else 3)
            # the real Collector beside the bridge on the same spans; span end -> transition through it
            otel_collector(report, workdir, runs=2000 if args.quick else 5000, latency_runs=30 if args.quick else 100)
            # the bridge's CPU per span with and without the shipped config's content filter
            from bench.otel_filter import otel_filter_rows

            otel_filter_rows(report, workdir, quick=args.quick)
    finally:
        if args.keep:
            progress(f"logs kept in {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    elapsed = time.monotonic() - started
    command = "python -m bench.run" + (" --quick" if args.quick else "")
    header = (f"{datetime.date.today().isoformat()}, `{command}` in {elapsed:.0f} s; "
              f"{machine_note()}")
    print_table(report, header)
    print_markdown(report, header)
    return 0


def print_table(report: Report, header: str) -> None:
    w_fig = max(len(r.figure) for r in report.rows)
    w_val = max(len(r.value) for r in report.rows)
    print(header)
    last = None
    for r in report.rows:
        bench = r.bench if r.bench != last else ""
        last = r.bench
        print(f"{bench:<9} {r.figure:<{w_fig}}  {r.value:>{w_val}}  {r.note}".rstrip())
    print()


def print_markdown(report: Report, header: str) -> None:
    print("<!-- bench/results.md-style -->")
    print(f"Run: {header}\n")
    print("| bench | figure | value | note |")
    print("|---|---|---:|---|")
    for r in report.rows:
        print(f"| {r.bench} | {r.figure.strip()} | {r.value} | {r.note} |")
    sys.stdout.flush()


if __name__ == "__main__":
    sys.exit(main())
