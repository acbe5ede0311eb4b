"""Bounded recovery on a real broker (docs/recovery.md): the worker publishes on agent.actions, read_committed,
the actions offline replay decides on the same events, each keyed by its job id."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from tests.integration.harness import make_worker, publish, read_all, run, tick, unique_config
from tests.recovery_fleet import recovery_fleet
from tests.recovery_kafka import ADVANCE_MS, differences, messages, policies_file, read_actions, replay_actions

pytestmark = pytest.mark.timeout(300)


def test_runs_with_a_recovery_policy_publish_replays_actions_on_agent_actions(kafka, tmp_path: Path) -> None:
    """A fleet under recovery policies (its own, or its agent's default from the policies file): agent.actions
    holds exactly replay's actions, each once, keyed by job id."""
    events = recovery_fleet(60)
    expected = replay_actions(events)
    assert {a["action"] for a in expected.values()} >= {"resume", "restart", "escalate"}
    config = unique_config(kafka.bootstrap, recovery_policies=policies_file(tmp_path))
    worker = make_worker(config, tmp_path, clock="event").start()
    try:
        run(publish(worker.config, [tuple(m) for m in messages(events)]))
        run(tick(worker.config, max(e["ts"] for e in events) + ADVANCE_MS))
        read_actions(worker.config, len(expected))
        records = run(read_all(worker.config, worker.config.actions_topic))
    finally:
        worker.stop()
    got = [json.loads(r.value) for r in records]
    assert not [k for k, n in Counter(a["action_id"] for a in got).items() if n > 1]
    assert not differences(got, expected)
    assert all(r.key == json.loads(r.value)["job_id"].encode() for r in records)
