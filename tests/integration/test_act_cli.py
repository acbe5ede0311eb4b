"""`loopwarden act` against the real broker: a person's signed operator action lands on agent.steps, keyed by run."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import msgspec
import pytest

from loopwarden.codecs.events import OperatorAction
from loopwarden.stages.topics import ensure_topics
from loopwarden.trust import SigningKey, TrustedVerifiers
from tests.integration.harness import env_for, read_topic, run, unique_config

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


def test_act_publishes_a_signed_operator_action_on_agent_steps_keyed_by_its_run(kafka, tmp_path: Path) -> None:
    """The record on agent.steps is the operator_action asked for (run, action, reason, actor, bound override,
    run_started_ts, a fresh request id), keyed by the run id, and the person's key verifies it."""
    config = unique_config(kafka.bootstrap)
    run(ensure_topics(config))
    key = SigningKey.generate("oncall-7")
    key.save(tmp_path / "oncall.pem")
    res = subprocess.run(
        [sys.executable, "-m", "loopwarden.cli", "act", "invoice-42", "retry", "--reason", "the ERP is back",
         "--key", str(tmp_path / "oncall.pem"), "--override-bound", "--actor", "dana@example.com",
         "--run-started-ts", "1780000000000"],
        env=env_for(config), capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert "published retry on run 'invoice-42'" in res.stderr and "oncall-7/dana@example.com" in res.stderr
    records = run(read_topic(config, config.steps_topic, lambda rs: len(rs) >= 1, timeout_s=60))
    assert len(records) == 1 and records[0].key == b"invoice-42"
    action = msgspec.json.decode(records[0].value, type=OperatorAction)
    assert (action.run_id, action.action, action.reason, action.override_bound, action.actor, action.run_started_ts) \
        == ("invoice-42", "retry", "the ERP is back", True, "dana@example.com", 1_780_000_000_000)
    assert len(action.request_id) == 36 and action.request_id in res.stderr
    assert TrustedVerifiers.parse(key.setting).why_untrusted(action) is None
