"""The broker stopped mid-stream (SIGTERM, then SIGKILL) for a while and restarted on the same data dir
and port: the worker, never restarted, reconnects on its own; nothing is lost, repeated or wrong."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from dev.localkafka import LocalKafka, free_port
from loopwarden.simulate import fleet
from tests.faults.oracle import check, figures, wait_runs
from tests.integration.harness import make_worker, publish, run, tick, unique_config
from tests.integration.test_processor import ADVANCE_MS, replay_final

DOWN_S = float(os.environ.get("LOOPWARDEN_FAULT_DOWN_S", "20"))
pytestmark = pytest.mark.timeout(int(300 + 4 * DOWN_S))


def _down(broker: LocalKafka, sig: int) -> None:
    assert broker.proc is not None
    if sig == signal.SIGKILL:
        broker.proc.kill()
        broker.proc.wait()
    broker.stop()  # SIGTERM and wait (a killed one is only forgotten)


def test_broker_stopped_and_killed_mid_stream_worker_reconnects(tmp_path: Path) -> None:
    port, controller = free_port(), free_port()
    broker = LocalKafka(tmp_path / "kafka", port=port, controller_port=controller, heap="512m").start(timeout_s=120)
    worker = None
    try:
        config = unique_config(broker.bootstrap, partitions=4)
        worker = make_worker(config, tmp_path, clock="event", session_timeout_s=6.0).start()
        assert worker.proc is not None
        pid = worker.proc.pid
        messages = fleet(2400, seed=41, bad_every=0)
        expected, last = replay_final(messages)
        n = len(messages)
        thirds = [messages[: n // 3], messages[n // 3: 2 * n // 3], messages[2 * n // 3:]]  # in order
        outages = []
        for part, sig in zip(thirds[:2], (signal.SIGTERM, signal.SIGKILL)):
            run(publish(worker.config, [(m.topic, m.key, m.value) for m in part]))
            time.sleep(0.5)  # the worker is mid-backlog: transactions in flight
            t0 = time.monotonic()
            _down(broker, sig)
            time.sleep(DOWN_S)
            assert worker.proc.poll() is None, f"the worker exited while the broker was down:\n{worker.log_tail()}"
            broker.start(timeout_s=120)
            assert broker.bootstrap.endswith(f":{port}")
            outages.append(f"{signal.Signals(sig).name} {time.monotonic() - t0:.0f}s")
        run(publish(worker.config, [(m.topic, m.key, m.value) for m in thirds[2]]))
        run(tick(worker.config, last + ADVANCE_MS))
        ts = wait_runs(worker.config, expected, timeout_s=240)
        time.sleep(2)
        ts = wait_runs(worker.config, expected, timeout_s=10)
        assert worker.proc.poll() is None and worker.proc.pid == pid  # the same process throughout
        fig = figures("broker restart", "broker " + ", ".join(outages) + " (same dir and port)", ts, expected)
        check(fig)
    finally:
        if worker is not None:
            worker.stop()
        broker.stop()
