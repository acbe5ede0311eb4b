"""The Kafka commands against a real broker: `simulate` sends each event at its ts (so the worker's
latency histogram measures the worker), and `tail` under a broker outage stays readable."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from dev.localkafka import LocalKafka
from loopwarden.stages.topics import ensure_topics
from tests.integration.harness import env_for, make_worker, unique_config

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


def latency_buckets(worker) -> dict[float, float]:
    status, body = worker.get("/metrics")
    assert status == 200
    return {float(s.labels["le"]): s.value for f in text_string_to_metric_families(body.decode())
            if f.name == "loopwarden_event_to_transition_seconds" for s in f.samples if s.name.endswith("_bucket")}


def test_simulate_stamps_events_when_it_sends_them(kafka, tmp_path: Path) -> None:
    """The fleet starts once the producer is up and each event is sent at its ts, so the worker's latency
    histogram measures the worker, not the producer's connecting (which would put every observation >= 0.1 s)."""
    config = unique_config(kafka.bootstrap)
    worker = make_worker(config, tmp_path).start()
    try:
        sim = subprocess.Popen([sys.executable, "-m", "loopwarden.cli", "simulate", "--runs", "20", "--rate", "10",
                                "--bad-every", "0"], env=env_for(worker.config), stderr=subprocess.PIPE, text=True)
        try:  # the runs' later events (receipts, approvals) come minutes later: 40 transitions are enough
            deadline = time.monotonic() + 90
            while (b := latency_buckets(worker))[float("inf")] < 40 and time.monotonic() < deadline:
                assert sim.poll() is None, sim.stderr.read()
                time.sleep(0.5)
        finally:
            sim.terminate()
            sim.wait(timeout=30)
        assert b[float("inf")] >= 40, b
        assert b[0.1] > 0, f"no transition within 0.1 s of its event: {b}"
    finally:
        worker.stop()


def test_tail_through_a_broker_outage_prints_a_few_lines_not_a_flood(tmp_path: Path) -> None:
    """aiokafka logs each failed reconnect; `tail` lets the same line through once per 10 s."""
    broker = LocalKafka(tmp_path / "kafka", heap="384m").start(timeout_s=120)
    config = unique_config(broker.bootstrap)
    asyncio.run(ensure_topics(config))  # tail reads the health topic a worker made; it creates none itself
    tail = subprocess.Popen([sys.executable, "-m", "loopwarden.cli", "tail", "--health-topic", config.health_topic],
                            env=env_for(config), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(5)  # connected, waiting for transitions
        assert tail.poll() is None, tail.stderr.read()
        broker.stop()
        time.sleep(25)
    finally:
        tail.terminate()
        _, err = tail.communicate(timeout=30)
        broker.stop()
    lines = [line for line in err.splitlines() if line.strip()]
    assert lines, "the outage went unmentioned"
    assert all(line.startswith("loopwarden tail: ") for line in lines), lines[:5]
    assert len(lines) <= 30, f"{len(lines)} lines in 25 s:\n" + "\n".join(lines[:40])
