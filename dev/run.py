"""`make dev`: a local Apache Kafka, one loopwarden worker and a live simulated fleet; transitions shown until Ctrl-C.

``python -m dev.run [--port 9092] [--dir .kafka] [--clean] [--runs 300] [--rate 3] [--web-port 6066]``.
Lives in dev/ with the broker helper: a checkout's demo, not part of the installed package.

Each start publishes a fleet with run ids of its own (the seed is the start time), so a second
start on the same broker data shows a live fleet: transitions already on agent.health when it starts
are counted in one line, not shown again; every later one is shown, whoever produced the run. Every
port falls back to a free one when taken; if the worker exits, the demo stops with the worker's last
log lines. The demo creates its topics (4 partitions each) before any reader or writer starts, so
none is auto-created by the broker with another count. A status line every ``--status-every-s``
seconds tells the fleet's runs seen (a transition shown), runs held by state and dead letters.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from pathlib import Path

from dev.localkafka import LocalKafka, fetch, free_port, port_free
from loopwarden.codecs.states import STATE_TABLE
from loopwarden.docs_links import state_action, state_doc
from loopwarden.commands.clients import COLORS, format_transition
from loopwarden.commands.cliutil import plural
from loopwarden.config import Config, from_env
from loopwarden.stages.topics import ensure_topics

LEGEND = """\
make dev: what you see
  one line per health transition from now on, of every producer: time, run id, from -> to, reason
  this start's fleet is run-{seed}-...; bad messages (one every 40 runs) go to agent.deadletter
  the states (colour, short name in the status line, what to do; more in docs/states.md):
{states}
  try:  curl -s 'http://127.0.0.1:{web}/runs?state=STUCK'      curl -s http://127.0.0.1:{web}/metrics | grep ^loopwarden_runs
        .venv/bin/loopwarden tail --broker {broker} --from-beginning --state STUCK
        .venv/bin/loopwarden deadletters --broker {broker}
"""
# The status line's short names (it must fit 100 columns with all ten states held).
SHORT = {s.name: s.short for s in STATE_TABLE}
WIDTH = 100
PARTITIONS = 4  # of every topic the demo creates


def legend_states(color: bool) -> str:
    """One line per state: its colour, its short name, what to do, and its link in docs/states.md."""
    lines = []
    for state, short in SHORT.items():
        name = f"\x1b[{COLORS.get(state, '0')}m{state:<17}\x1b[0m" if color else f"{state:<17}"
        lines.append(f"    {name} {short:<5} {state_action(state):<34} {state_doc(state)}")
    return "\n".join(lines)


def _metrics(web_port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{web_port}/metrics", timeout=5) as r:
        out: dict[str, float] = {}
        for line in r.read().decode().splitlines():
            if line.startswith("loopwarden_") and " " in line:
                name, value = line.rsplit(" ", 1)
                out[name] = float(value)
        return out


def status_line(metrics: dict[str, float], runs: int, seen: int) -> str:
    """``make dev: x/N runs · RUN n STCK n … · n dead letters`` (the fleet's runs seen, runs held by state from a
    worker's metrics), at most WIDTH columns (the least held states give way to ``+k more`` if it would not fit).

    ``seen`` counts the fleet's runs with a transition shown, not ``run_started`` events: some of the fleet's
    runs never send one (a producer that lost it), and they are runs all the same."""
    held = Counter()
    for k, v in metrics.items():
        if k.startswith("loopwarden_runs{") and v:
            held[k.split('state="')[1].split('"')[0]] += int(v)
    dead = sum(v for k, v in metrics.items() if k.startswith("loopwarden_invalid_events_total{"))
    head, tail = f"make dev: {seen}/{runs} runs ·", f" · {plural(int(dead), 'dead letter')}"
    parts = [f"{SHORT.get(s, s)} {n}" for s, n in held.most_common()]
    for keep in range(len(parts), -1, -1):
        more = f" +{len(parts) - keep} more" if keep < len(parts) else ""
        line = f"{head} {' '.join(parts[:keep]) or 'none yet'}{more}{tail}"
        if len(line) <= WIDTH:
            return line
    return line[:WIDTH]


async def _show(config: Config, stop_at: float | None, worker: subprocess.Popen, args) -> int:
    """Tail agent.health from the beginning: earlier starts' transitions counted, every later one shown; the
    status line counts this start's fleet (``run-<seed>-``) by the runs shown."""
    from aiokafka import AIOKafkaConsumer

    from aiokafka import TopicPartition

    from loopwarden.stages.topics import partition_count

    # What agent.health held when this start began is earlier starts' (counted, not shown); every
    # transition after that is shown, whoever produced its run (this fleet, an emitter, `simulate`).
    n = await partition_count(config, config.health_topic) or 0
    consumer = AIOKafkaConsumer(config.health_topic, bootstrap_servers=config.bootstrap,
                                auto_offset_reset="earliest", enable_auto_commit=False, group_id=None,
                                isolation_level="read_committed")
    await consumer.start()
    boundary = await consumer.end_offsets([TopicPartition(config.health_topic, p) for p in range(n)]) if n else {}
    boundary = {tp.partition: off for tp, off in boundary.items()}
    color = sys.stdout.isatty()
    fleet = f"run-{args.seed}-"
    seen: set[str] = set()
    earlier = 0
    said_earlier = False
    next_status = time.monotonic() + args.status_every_s
    try:
        while stop_at is None or time.monotonic() < stop_at:
            if worker.poll() is not None:
                print(f"make dev: the worker exited ({worker.returncode}); its log ends:", file=sys.stderr)
                log = (Path(args.dir) / "worker.log").read_text(errors="replace").splitlines()[-15:]
                print("\n".join("  " + line for line in log), file=sys.stderr, flush=True)
                return 1
            batch = await consumer.getmany(timeout_ms=500)
            for records in batch.values():
                for rec in records:
                    t = json.loads(rec.value)
                    if rec.offset < boundary.get(rec.partition, 0):
                        earlier += 1
                        continue
                    if not said_earlier:
                        said_earlier = True
                        if earlier:
                            print(f"make dev: {earlier} transitions of earlier starts on this broker's data not shown "
                                  f"(--clean starts empty)", file=sys.stderr, flush=True)
                    print(format_transition(t, color), flush=True)
                    if t["run_id"].startswith(fleet):
                        seen.add(t["run_id"])
            if time.monotonic() >= next_status:
                next_status = time.monotonic() + args.status_every_s
                try:
                    print(status_line(_metrics(args.web_port), args.runs, len(seen)), file=sys.stderr, flush=True)
                except OSError:
                    pass  # the worker is still starting
        return 0
    finally:
        await consumer.stop()


def run(args: argparse.Namespace) -> int:
    """Start a local Kafka, one worker and a live simulated fleet; tail transitions until Ctrl-C."""
    fetch(quiet=False)
    if args.clean and Path(args.dir).exists():
        shutil.rmtree(args.dir)
        print(f"make dev: --clean: removed {args.dir}", file=sys.stderr)
    port = args.port if port_free(args.port) else free_port()
    if port != args.port:
        print(f"make dev: port {args.port} is taken; the broker uses {port}", file=sys.stderr)
    if not port_free(args.web_port):
        taken, args.web_port = args.web_port, free_port(exclude=(port,))
        print(f"make dev: port {taken} is taken; the worker's HTTP port is {args.web_port}", file=sys.stderr)
    kafka = LocalKafka(Path(args.dir), port=port)
    print(f"make dev: starting Apache Kafka on 127.0.0.1:{port} (data in {args.dir}) ...", file=sys.stderr, flush=True)
    kafka.start(timeout_s=120)
    env = {**os.environ, "LOOPWARDEN_BROKER": kafka.bootstrap, "LOOPWARDEN_PARTITIONS": str(PARTITIONS)}
    config = from_env({"broker": kafka.bootstrap, "partitions": PARTITIONS})
    # Made here, before the worker, the fleet and the reader below: the broker would auto-create a topic
    # a reader asks for first with 1 partition (dev/kafka/server.properties).
    asyncio.run(ensure_topics(config))
    seed = args.seed = int(time.time() * 1000) % 10**9  # run ids of this start: run-<seed>-...
    procs: list[subprocess.Popen] = []
    lw = [sys.executable, "-m", "loopwarden.cli"]
    try:
        worker_log = open(Path(args.dir) / "worker.log", "ab")
        worker = subprocess.Popen([*lw, "worker", "--web-port", str(args.web_port)], env=env,
                                  stdout=worker_log, stderr=subprocess.STDOUT)
        procs.append(worker)
        print(f"make dev: worker started (log {args.dir}/worker.log; http://127.0.0.1:{args.web_port}/metrics)",
              file=sys.stderr, flush=True)
        procs.append(subprocess.Popen([*lw, "simulate", "--runs", str(args.runs), "--rate", str(args.rate),
                                       "--seed", str(seed), "--inactivity-s", "20", "--window-s", "30",
                                       "--bad-every", "40"], env=env))
        print(LEGEND.format(seed=seed, web=args.web_port, broker=kafka.bootstrap,
                            states=legend_states(sys.stderr.isatty())), file=sys.stderr, flush=True)
        print(f"make dev: publishing {args.runs} runs (run-{seed}-...); transitions below (Ctrl-C to stop)\n",
              file=sys.stderr, flush=True)
        stop_at = time.monotonic() + args.duration_s if args.duration_s else None
        try:
            return asyncio.run(_show(config, stop_at, worker, args))
        except KeyboardInterrupt:
            return 0
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
        kafka.stop()
        print("make dev: stopped", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m dev.run", description=__doc__.splitlines()[0])
    p.add_argument("--port", type=int, default=9092, help="broker port (a free one if taken)")
    p.add_argument("--dir", default=".kafka", help="broker working directory (default .kafka)")
    p.add_argument("--clean", action="store_true", help="delete the broker's data first (start empty)")
    p.add_argument("--runs", type=int, default=300)
    p.add_argument("--rate", type=float, default=3.0)
    p.add_argument("--web-port", dest="web_port", type=int, default=6066, help="worker HTTP port (a free one if taken)")
    p.add_argument("--status-every-s", dest="status_every_s", type=float, default=15.0)
    p.add_argument("--duration-s", dest="duration_s", type=float, default=None, help="stop after this long (tests)")
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
