"""A worker's life cycle around its broker."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from dev.localkafka import LocalKafka
from tests.integration.harness import make_worker, unique_config

pytestmark = pytest.mark.timeout(180)


def test_worker_told_to_stop_exits_even_when_its_broker_is_gone(tmp_path: Path) -> None:
    """A Kafka client's stop can wait forever on a broker that is gone. With LOOPWARDEN_SHUTDOWN_TIMEOUT_S the
    worker exits by then regardless;
    meanwhile aiokafka's repeated connection errors are logged once per interval, not ten a second."""
    broker = LocalKafka(tmp_path / "kafka", heap="512m")  # its own: this test kills it
    broker.start(timeout_s=120)
    try:
        worker = make_worker(unique_config(broker.bootstrap), tmp_path, shutdown_timeout_s=3.0).start()
    finally:
        broker.stop()
    assert worker.proc is not None and worker.proc.poll() is None
    time.sleep(2)  # the worker notices: connection errors
    asked = time.monotonic()
    worker.proc.send_signal(signal.SIGTERM)
    try:
        code = worker.proc.wait(timeout=30)
    except Exception:
        worker.proc.kill()
        raise AssertionError(f"worker still running 30 s after SIGTERM:\n{worker.log_tail()}") from None
    took = time.monotonic() - asked
    log = worker.log_path.read_text(errors="replace")
    assert code in (0, 3), (code, worker.log_tail())
    # Connection errors come ten a second while the broker is gone, worded as refused or as closed depending
    # on the moment; the log holds one per node per 10 s whatever the wording.
    assert log.count("Unable connect to node with id") == 1, worker.log_tail()
    if code == 3:  # cut short by the watchdog, and says so
        assert "did not stop within 3s" in log
        assert took >= 3
