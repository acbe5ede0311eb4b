"""The worker's settings and metrics of bounded recovery (docs/recovery.md, docs/configuration.md)."""

from __future__ import annotations

import pytest
from prometheus_client import generate_latest

from loopwarden.codecs.events import RecoveryAction
from loopwarden.engine.config import Config, from_env
from loopwarden.engine.exceptions import ConfigError
from loopwarden.engine.metrics import Metrics
from loopwarden.engine.topics import outputs, wanted


def action(action_id: str, action: str, decided_by: str, reason: str = "STUCK:no_progress") -> RecoveryAction:
    return RecoveryAction(action_id=action_id, run_id="r", agent="a", job_id="j", attempt=1, next_attempt=None, action=action,  # type: ignore[arg-type]
                          reason=reason, ts=1, not_before_ts=1, next_policy=None, escalate_to=None, decided_by=decided_by)


def test_a_bad_recovery_policies_file_stops_the_start_in_one_line(tmp_path) -> None:
    """LOOPWARDEN_RECOVERY_POLICIES naming a bad policy is refused at start, naming the setting, agent and field."""
    path = tmp_path / "recovery.json"
    path.write_text('{"invoice": {"max_attempts": 0}}')
    with pytest.raises(ConfigError) as info:
        from_env(environ={"LOOPWARDEN_RECOVERY_POLICIES": str(path)})
    message = str(info.value)
    assert message.startswith(f"recovery_policies: {path}: agent 'invoice': ") and "$.max_attempts" in message
    assert "\n" not in message
    with pytest.raises(ConfigError, match="cannot read"):
        from_env(environ={"LOOPWARDEN_RECOVERY_POLICIES": str(tmp_path / "missing.json")})


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
    m = Metrics()
    m.recovery.published([action("a:1", "resume", "policy:v3"), action("a:2", "escalate", "policy:v3", "attempts_exhausted"),
                          action("a:op:q", "restart", "person:ops-1/ana")])
    m.count_batch({("operator_action", "unsigned"): 2, ("operator_action", "applied"): 1})
    text = generate_latest(m.registry).decode()
    assert 'loopwarden_recovery_actions_total{action="resume",decided_by="policy"} 1.0' in text
    assert 'loopwarden_recovery_actions_total{action="restart",decided_by="person"} 1.0' in text
    assert "loopwarden_recovery_attempts_exhausted_total 1.0" in text
    assert 'loopwarden_operator_actions_refused_total{reason="unsigned"} 2.0' in text
    assert "ops-1" not in text and "v3" not in text
