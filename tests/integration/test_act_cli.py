"""`loopwarden act` against the real broker: a person's signed operator action lands on agent.steps, keyed by run,
and a worker trusting the person's key turns it into their recovery action."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import msgspec
import pytest

from loopwarden.codecs.events import OperatorAction
from loopwarden.stages.topics import ensure_topics
from loopwarden.trust import SigningKey, TrustedVerifiers
from tests.integration.harness import (
    env_for, make_worker, publish, read_all, read_topic, run, unique_config, wait_for,
)

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


def test_a_persons_retry_from_the_cli_becomes_a_restart_decided_by_them_and_an_unsigned_one_changes_nothing(
        kafka, tmp_path: Path) -> None:
    """A FAILED run without a policy: `loopwarden act … retry --override-bound` signed by a trusted key becomes one
    `restart` on agent.actions decided by `person:<key id>/<actor>`; the same action unsigned publishes nothing and
    is counted as refused."""
    config = unique_config(kafka.bootstrap, partitions=1)
    key = SigningKey.generate("oncall-7")
    key.save(tmp_path / "oncall.pem")
    worker = make_worker(config, tmp_path, clock="event")
    worker.extra_env = {"LOOPWARDEN_TRUSTED_VERIFIERS": key.setting}
    now = int(time.time() * 1000)
    run_id = "invoice-43"
    failed = [
        {"type": "run_started", "run_id": run_id, "ts": now, "agent": "invoices", "policy": {"version": "v1"}},
        {"type": "step_finished", "run_id": run_id, "ts": now + 1, "step": 0, "finish_reason": "tool-calls",
         "tool_calls": [{"id": "c1", "name": "create_invoice", "status": "error"}]},
        {"type": "run_ended", "run_id": run_id, "ts": now + 2, "cause": "tool_error", "step_count": 1,
         "approval": None, "error_name": "ERPDown"},
    ]
    worker.start()
    try:
        run(publish(config, [("steps", run_id.encode(), json.dumps(e).encode()) for e in failed]))
        run(read_topic(config, config.health_topic,
                       lambda rs: any(json.loads(r.value)["to_state"] == "FAILED" for r in rs)))
        unsigned = OperatorAction(run_id=run_id, ts=now + 5, request_id="r-unsigned", action="retry",
                                  reason="just do it", override_bound=True)
        run(publish(config, [("steps", run_id.encode(), msgspec.json.encode(unsigned))]))
        wait_for(lambda: 'loopwarden_operator_actions_refused_total{reason="unsigned"} 1.0'
                 in worker.get("/metrics")[1].decode())
        res = subprocess.run(
            [sys.executable, "-m", "loopwarden.cli", "act", run_id, "retry", "--reason", "the ERP is back",
             "--key", str(tmp_path / "oncall.pem"), "--override-bound", "--actor", "dana",
             "--run-started-ts", str(now)],
            env=env_for(config), capture_output=True, text=True, timeout=120)
        assert res.returncode == 0, res.stderr
        actions = run(read_topic(config, config.actions_topic, lambda rs: len(rs) >= 1, timeout_s=60))
        time.sleep(1)  # nothing more comes: the unsigned retry was refused
        actions = run(read_all(config, config.actions_topic))
    finally:
        worker.stop()
    got = [json.loads(r.value) for r in actions]
    assert [(a["action"], a["decided_by"], a["reason"], a["override_bound"], a["next_attempt"]) for a in got] == [
        ("restart", "person:oncall-7/dana", "the ERP is back", True, 2)]
    assert got[0]["action_id"].startswith(f"{run_id}:op:") and actions[0].key == run_id.encode()
