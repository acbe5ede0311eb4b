"""Real AI SDK agents publish through the emitter's Kafka sink; the loopwarden processor classifies them."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.e2e.test_ai_sdk_agents import EMITTER, RUN_AGENTS, _built, _node
from tests.integration.harness import make_worker, tick, unique_config, run
from tests.integration.test_processor import wait_final

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]


def test_agents_through_kafka_reach_the_expected_states(kafka, tmp_path: Path) -> None:
    """Every research-note case, published by the TypeScript KafkaSink, ends in the state docs/contract.md prescribes."""
    node = _node()
    _built(node)
    config = unique_config(kafka.bootstrap)
    worker = make_worker(config, tmp_path, clock="event").start()  # creates the topics, co-partitioned
    try:
        out = tmp_path / "agents"
        proc = subprocess.run(
            [node, str(RUN_AGENTS), "--out", str(out), "--kafka", kafka.bootstrap,
             "--steps-topic", config.steps_topic, "--outcomes-topic", config.outcomes_topic],
            cwd=EMITTER, capture_output=True, text=True, timeout=300, env={**os.environ, "NODE_NO_WARNINGS": "1"},
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        expected = json.loads((out / "expected.json").read_text())
        last_ts = max(json.loads(line)["ts"] for line in (out / "events.jsonl").read_text().splitlines() if line)
        run(tick(worker.config, last_ts + 1_800_000))
        transitions = wait_final(worker.config, expected, timeout_s=120)
        final = {}
        for t in sorted(transitions, key=lambda t: t["seq"]):
            final[t["run_id"]] = t["to_state"]
        assert final == expected
        assert not [t for t in transitions if t["evidence"]["disagreements"]]
    finally:
        worker.stop()
