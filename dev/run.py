"""`make dev`: a local Apache Kafka, one loopwarden worker and a live simulated fleet; transitions shown until Ctrl-C.

``python -m dev.run [--port 9092] [--dir .kafka] [--runs 300] [--rate 3] [--web-port 6066]``.
Lives in dev/ with the broker helper: a checkout's demo, not part of the installed package.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

from dev.localkafka import LocalKafka, fetch, free_port, port_free
from loopwarden.streams.commands import _tail as tail
from loopwarden.streams.config import from_env


def run(args: argparse.Namespace) -> int:
    """Start a local Kafka, one worker and a live simulated fleet; tail transitions until Ctrl-C."""
    fetch(quiet=False)
    port = args.port if port_free(args.port) else free_port()
    kafka = LocalKafka(Path(args.dir), port=port)
    print(f"make dev: starting Apache Kafka on 127.0.0.1:{port} (data in {args.dir}) ...", file=sys.stderr, flush=True)
    kafka.start(timeout_s=120)
    env = {**os.environ, "LOOPWARDEN_BROKER": kafka.bootstrap, "LOOPWARDEN_PARTITIONS": "4"}
    procs: list[subprocess.Popen] = []
    lw = [sys.executable, "-m", "loopwarden.cli"]
    try:
        worker_log = open(Path(args.dir) / "worker.log", "ab")
        procs.append(subprocess.Popen([*lw, "worker", "--web-port", str(args.web_port)], env=env,
                                      stdout=worker_log, stderr=subprocess.STDOUT))
        print(f"make dev: worker started (log {args.dir}/worker.log; metrics http://127.0.0.1:{args.web_port}/metrics)",
              file=sys.stderr, flush=True)
        procs.append(subprocess.Popen([*lw, "simulate", "--runs", str(args.runs), "--rate", str(args.rate),
                                       "--inactivity-s", "20", "--window-s", "30", "--bad-every", "40"], env=env))
        print("make dev: simulated fleet publishing; transitions below (Ctrl-C to stop)\n", file=sys.stderr, flush=True)
        ns = argparse.Namespace(from_beginning=True, json=False, idle_exit_s=None)
        try:
            asyncio.run(tail(from_env({"broker": kafka.bootstrap}), ns))
        except KeyboardInterrupt:
            pass
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
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m dev.run", description=__doc__.splitlines()[0])
    p.add_argument("--port", type=int, default=9092, help="broker port (a free one if taken)")
    p.add_argument("--dir", default=".kafka", help="broker working directory (default .kafka)")
    p.add_argument("--runs", type=int, default=300)
    p.add_argument("--rate", type=float, default=3.0)
    p.add_argument("--web-port", dest="web_port", type=int, default=6066)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
