"""The OpenTelemetry bridge as a stage on the engine, on a real broker: exactly-once under SIGKILL.

`loopwarden bridge` (its own process, its own group) reads TracesData messages from
``otlp_spans`` and publishes run events on ``agent.steps``; a `loopwarden worker` turns them
into transitions. The bridge is SIGKILLed again and again while spans arrive: every run's
events must be on agent.steps exactly once (read_committed), and the worker's transitions
exactly once, every run at the state its spans call for.
"""

from __future__ import annotations

import signal
import time
from collections import Counter
from dataclasses import replace

import msgspec
import pytest
from aiokafka import AIOKafkaProducer

from dev.localkafka import free_port
from loopwarden.stages.topics import ensure_topics
from tests.faults.test_worker_faults import assert_exactly_once
from tests.integration.harness import make_worker, read_topic, run, transitions, unique_config
from tests.otel.traces import T0, Run, traces

pytestmark = pytest.mark.timeout(400)

RUNS = 240


def _messages(start_ms: int, runs: int = RUNS) -> list[tuple[bytes, bytes]]:
    """Per run: its children in one message, its run span in a later one (spans arrive as they end)."""
    out = []
    for i in range(runs):
        r = Run(agent=f"agent-{i % 3}", start_ms=start_ms + i)
        children = [r.chat("tool_calls"), r.tool("lookup"), r.chat("stop")]
        key = r.tid.hex().encode()
        out.append((key, traces(*children)))
        out.append((key, traces(r.end())))
    return out


async def _send(bootstrap: str, topic: str, batch: list[tuple[bytes, bytes]]) -> None:
    async with AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all") as producer:
        for key, value in batch:
            await producer.send(topic, value, key=key)
        await producer.flush()


def test_the_bridge_is_exactly_once_under_sigkill(kafka, tmp_path) -> None:
    """SIGKILL the bridge 4 times mid-stream: each run's 4 events once on agent.steps; transitions once; VERIFYING."""
    config = unique_config(kafka.bootstrap, partitions=4, otel_topic=f"otlp-{time.monotonic_ns()}", otel_partitions=3)
    run(ensure_topics(config))
    worker = make_worker(config, tmp_path, "w").start()
    bridge = make_worker(config, tmp_path, "b")
    bridge.command = "bridge"
    bridge.start()
    messages = _messages(int(time.time() * 1000) - T0 // 1_000_000 - 60_000)  # a minute ago (Run counts from T0)
    chunk = len(messages) // 5
    kills = 0
    try:
        for i in range(0, len(messages), chunk):
            run(_send(config.broker, config.otel_topic, messages[i:i + chunk]))
            time.sleep(0.4)  # let the bridge be mid-batch
            if kills < 4:
                bridge.stop(signal.SIGKILL)
                kills += 1
                bridge.config = replace(bridge.config, web_port=free_port())
                bridge.start()

        def all_ended(records) -> bool:
            return sum(b'"run_ended"' in r.value for r in records) >= RUNS

        steps = run(read_topic(config, config.steps_topic, all_ended, timeout_s=120))
        events = [msgspec.json.decode(r.value) for r in steps]
        keys = Counter((e["run_id"], e["type"], e.get("step")) for e in events)
        repeated = [k for k, n in keys.items() if n > 1]
        assert not repeated, f"{len(repeated)} events published twice, e.g. {repeated[:3]}"
        runs = {e["run_id"] for e in events}
        assert len(runs) == RUNS
        per_run = Counter(e["run_id"] for e in events)
        assert set(per_run.values()) == {4}, Counter(per_run.values())  # run_started, 2 steps, run_ended
        assert all(r.key == msgspec.json.decode(r.value)["run_id"].encode() for r in steps)  # keyed by run id
        expected = dict.fromkeys(runs, "VERIFYING")  # a natural finish, no receipt yet

        def all_verifying(records) -> bool:
            final = {}
            for t in map(msgspec.json.decode, (r.value for r in records)):
                final[t["run_id"]] = t["to_state"]
            return sum(s == "VERIFYING" for s in final.values()) >= RUNS

        health = run(read_topic(config, config.health_topic, all_verifying, timeout_s=120))
        assert_exactly_once(transitions(health), expected)
    finally:
        bridge.stop()
        worker.stop()
    assert kills == 4


def test_the_worker_runs_the_bridge_in_its_process_with_otel(kafka, tmp_path) -> None:
    """`loopwarden worker --otel`: spans on otlp_spans become transitions with no other process; /metrics counts them."""
    config = unique_config(kafka.bootstrap, partitions=2, otel_topic=f"otlp-{time.monotonic_ns()}", otel_partitions=2)
    run(ensure_topics(config))
    worker = make_worker(config, tmp_path, "w")
    worker.args = ("--otel",)
    worker.start()
    try:
        run(_send(config.broker, config.otel_topic, _messages(int(time.time() * 1000) - T0 // 1_000_000 - 60_000, 20)))

        def all_verifying(records) -> bool:
            final = {}
            for t in map(msgspec.json.decode, (r.value for r in records)):
                final[t["run_id"]] = t["to_state"]
            return len(final) == 20 and set(final.values()) == {"VERIFYING"}

        health = run(read_topic(config, config.health_topic, all_verifying, timeout_s=60))
        assert all(t["run_id"].startswith("otel-") for t in transitions(health))
        status, body = worker.get("/metrics")
        assert status == 200
        assert b'loopwarden_otel_events_total{type="run_ended"} 20.0' in body

        # The bridge writes agent.steps in transactions: each ends in a marker no consumer is handed. Idle now,
        # the worker's steps partitions read no lag (not 1 each for ever) and none is stalled.
        def steps_lag() -> dict[str, float]:
            text = worker.get("/metrics")[1].decode()
            return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                    if line.startswith("loopwarden_consumer_lag{") and 'topic="steps"' in line}

        deadline = time.monotonic() + 15
        while any(steps_lag().values()) and time.monotonic() < deadline:
            time.sleep(0.2)
        lags = steps_lag()
        assert len(lags) == 2 and not any(lags.values()), lags
        assert b"loopwarden_stalled_partitions 0.0" in worker.get("/metrics")[1]
    finally:
        worker.stop()
