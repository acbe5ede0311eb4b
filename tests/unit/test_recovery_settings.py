"""The worker's settings and metrics of bounded recovery (docs/recovery.md, docs/configuration.md)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from prometheus_client import generate_latest

from loopwarden.codecs.events import RecoveryAction
from loopwarden.config import Config
from loopwarden.engine.exceptions import ConfigError
from loopwarden.engine.metrics import EngineMetrics
from loopwarden.stages.health.metrics import HealthMetrics
from loopwarden.stages.topics import outputs, wanted


REPO = Path(__file__).resolve().parents[2]


def action(action_id: str, action: str, decided_by: str, reason: str = "STUCK:no_progress") -> RecoveryAction:
    return RecoveryAction(action_id=action_id, run_id="r", agent="a", job_id="j", attempt=1, next_attempt=None, action=action,  # type: ignore[arg-type]
                          reason=reason, ts=1, not_before_ts=1, next_policy=None, escalate_to=None, decided_by=decided_by)


def test_a_bad_recovery_policies_file_stops_the_worker_in_one_line(tmp_path) -> None:
    """`loopwarden worker` with LOOPWARDEN_RECOVERY_POLICIES naming a bad policy stops before connecting, in one
    line naming the file, the agent and the field."""
    path = tmp_path / "recovery.json"
    path.write_text('{"invoice": {"max_attempts": 0}}')
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("LOOPWARDEN_")}, "PYTHONPATH": str(REPO),
           "LOOPWARDEN_RECOVERY_POLICIES": str(path), "LOOPWARDEN_BROKER": "127.0.0.1:1"}
    proc = subprocess.run([sys.executable, "-m", "loopwarden.cli", "worker"], capture_output=True, text=True,
                          env=env, timeout=60)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == (
        f"loopwarden worker: {path}: agent 'invoice': Expected `int` >= 1 - at `$.max_attempts`")


def test_the_actions_topic_is_created_and_checked_with_the_other_outputs() -> None:
    """agent.actions is an output: created by the worker and by `topics repair`, checked by `topics check`."""
    config = Config(actions_topic="fleet.actions")
    assert "fleet.actions" in wanted(config) and "fleet.actions" in outputs(config)
    with pytest.raises(ConfigError, match="actions_topic"):
        Config(actions_topic="bad topic")
    with pytest.raises(ConfigError, match="must differ"):
        Config(actions_topic="agent.health")


def test_recovery_metrics_count_actions_by_who_decided_with_bounded_labels() -> None:
    """Actions count by action and policy|person (never a key id or version); exhausted jobs and refusals too."""
    m = HealthMetrics(EngineMetrics())
    m.count_actions([action("a:1", "resume", "policy:v3"), action("a:2", "escalate", "policy:v3", "attempts_exhausted"),
                      action("a:op:q", "restart", "person:ops-1/ana")])
    m.count_batch({("operator_action", "unsigned"): 2, ("operator_action", "applied"): 1})
    text = generate_latest(m.registry).decode()
    assert 'loopwarden_recovery_actions_total{action="resume",decided_by="policy"} 1.0' in text
    assert 'loopwarden_recovery_actions_total{action="restart",decided_by="person"} 1.0' in text
    assert "loopwarden_recovery_attempts_exhausted_total 1.0" in text
    assert 'loopwarden_operator_actions_refused_total{reason="unsigned"} 2.0' in text
    assert "ops-1" not in text and "v3" not in text
