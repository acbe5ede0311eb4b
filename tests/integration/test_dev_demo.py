"""`make dev` as a newcomer meets it (python -m dev.run, its own broker): a live fleet on every start,
earlier starts summed up in one line, every port falling back, progress lines, and the worker's error
shown when it exits."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from dev.localkafka import free_port
from tests.conftest import REPO

pytestmark = [pytest.mark.integration, pytest.mark.timeout(400)]


def demo(work: Path, *args: str, env: dict | None = None, during=None) -> subprocess.CompletedProcess:
    """Run the demo to its end; ``during(bootstrap)`` runs in a thread meanwhile (another producer)."""
    port = free_port()
    cmd = [sys.executable, "-m", "dev.run", "--dir", str(work / "kafka"), "--port", str(port),
           "--runs", "12", "--rate", "6", "--status-every-s", "5", *args]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**(env or {k: v for k, v in os.environ.items() if not k.startswith("LOOPWARDEN_")})})
    thread = threading.Thread(target=during, args=(f"127.0.0.1:{port}",), daemon=True) if during else None
    if thread:
        thread.start()
    out, err = proc.communicate(timeout=300)
    if thread:
        thread.join(timeout=60)
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


SEEN: dict[str, int | None] = {}  # what another_producer found on the demo's broker


def another_producer(bootstrap: str) -> None:
    """Once the demo has created agent.steps, start a run of an agent that is not the demo's fleet; note how
    many partitions agent.health has by then (the demo's own reader is reading it)."""
    import asyncio

    from loopwarden.codecs import Policy, RunStarted
    from loopwarden.publisher import Publisher, now_ms
    from loopwarden.config import Config
    from loopwarden.stages.topics import partition_count

    async def go() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if await partition_count(Config(broker=bootstrap), "agent.steps", timeout_s=5):
                    break
            except Exception:  # the broker is still starting
                pass
            await asyncio.sleep(1)
        async with Publisher(bootstrap) as pub:
            await pub.publish(RunStarted(run_id="foreign-agent-run-1", ts=now_ms(), agent="someone-elses-agent",
                                         policy=Policy(version="v1")))
        SEEN["agent.health"] = await partition_count(Config(broker=bootstrap), "agent.health", timeout_s=10)
    asyncio.run(go())


def shown_runs(out: str) -> set[str]:
    return set(re.findall(r"\b(run-\d+-\d{6}-\w+)", out))


def test_demo_twice_on_the_same_data_then_a_worker_that_exits(tmp_path: Path) -> None:
    with socket.socket() as taken:  # the web port is in use: the demo must move, not die
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        web = taken.getsockname()[1]
        first = demo(tmp_path, "--web-port", str(web), "--duration-s", "30", during=another_producer)
    assert first.returncode == 0, first.stderr[-2000:]
    assert f"port {web} is taken; the worker's HTTP port is" in first.stderr
    seed1 = re.search(r"publishing 12 runs \(run-(\d+)-", first.stderr).group(1)
    runs1 = shown_runs(first.stdout)
    assert runs1 and all(r.startswith(f"run-{seed1}-") for r in runs1)
    assert "VERIFIED_COMPLETE" in first.stdout and "try:  curl" in first.stderr
    status = re.findall(r"^make dev: \d+/12 runs · .* · \d+ dead letters?$", first.stderr, flags=re.M)
    assert status and all(len(line) <= 100 for line in status), first.stderr[-1500:]
    assert status[-1].startswith("make dev: 12/12 runs"), status  # every run of the fleet, not those that sent run_started
    assert "docs/states.md#waiting_unrouted" in first.stderr  # the legend links each state to what to do
    assert "earlier starts" not in first.stderr
    # the demo made its topics before any reader: agent.health has the inputs' 4 partitions, not the 1 a
    # broker auto-creating it for the demo's reader would give
    assert SEEN.get("agent.health") == 4, SEEN
    # a healthy start on a fresh cluster: no ERROR in the worker's log (coordinator elections are retried)
    worker_log = (tmp_path / "kafka" / "worker.log").read_text(errors="replace")
    assert " ERROR " not in worker_log, worker_log[-3000:]
    # every producer's runs are shown, not only the demo fleet's (run-<seed>-...)
    assert re.search(r"foreign-agent-run-1\s+-\s+->\s+RUNNING\s+started", first.stdout), first.stdout[-2000:]

    second = demo(tmp_path, "--web-port", str(free_port()), "--duration-s", "25")
    assert second.returncode == 0, second.stderr[-2000:]
    seed2 = re.search(r"publishing 12 runs \(run-(\d+)-", second.stderr).group(1)
    assert seed2 != seed1
    runs2 = shown_runs(second.stdout)
    # live: this start's fleet, and (from the restored state) only new transitions of earlier runs
    assert any(r.startswith(f"run-{seed2}-") for r in runs2)
    assert not re.search(rf"run-{seed1}-\S+\s+-\s+->", second.stdout)  # no earlier run's first transition again
    earlier = int(re.search(r"make dev: (\d+) transitions of earlier starts", second.stderr).group(1))
    assert earlier >= len(runs1)

    env = {k: v for k, v in os.environ.items() if not k.startswith("LOOPWARDEN_")}
    broken = demo(tmp_path, "--web-port", str(free_port()), "--duration-s", "60",
                  env={**env, "LOOPWARDEN_STORE": "rocksdb", "LOOPWARDEN_DATA_DIR": str(tmp_path / "missing" / "data")})
    assert broken.returncode == 1, broken.stderr[-2000:]
    assert "make dev: the worker exited" in broken.stderr
    assert "does not exist or is not a directory" in broken.stderr  # the worker's own error, from its log
