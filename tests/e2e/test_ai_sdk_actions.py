"""The AI SDK emitter carries out recovery actions read from the real broker: each committed action handed to
`lw.onAction` once and when due, and each resume or restart starting the job's next attempt on agent.steps."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import time
import uuid
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer

from loopwarden.codecs import Policy, RunStarted, StepCount, decode_step_event
from loopwarden.codecs.events import RecoveryAction
from tests.e2e.test_ai_sdk_agents import EMITTER, _built, _node
from tests.integration.harness import create_topic
from tests.integration.test_actions_webhook import produce

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

ON_ACTION = EMITTER / "test" / "e2e" / "on-action.mjs"
TIGHTER = Policy(version="v1-tight", stop_when=(StepCount(count=4),), inactivity_timeout_s=60.0)


def action(job: str, now: int, **fields) -> RecoveryAction:
    base = dict(action_id=f"{job}:4", run_id=job, agent="invoices", job_id=job, attempt=1, next_attempt=2, action="resume",
                reason="STUCK:inactivity_timeout", ts=now, not_before_ts=now, next_policy=None, escalate_to=None,
                decided_by="policy:v1")
    return RecoveryAction(**(base | fields))


async def run_starteds(bootstrap: str, topic: str, want: int) -> list:
    consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest", group_id=None)
    await consumer.start()
    found, deadline = [], time.monotonic() + 60
    try:
        while len(found) < want and time.monotonic() < deadline:
            for records in (await consumer.getmany(timeout_ms=500)).values():
                found += [e for e in (decode_step_event(r.value) for r in records) if isinstance(e, RunStarted)]
    finally:
        await consumer.stop()
    return found


def test_on_action_hands_each_committed_action_over_once_and_starts_the_next_attempts(kafka, tmp_path: Path) -> None:
    """A resume, a restart due 3 s later with a next_policy and an escalation are handled once each; a repeated
    action_id and an aborted transaction's action are not; each next attempt's run_started names its job."""
    node = _node()
    _built(node)
    tag = uuid.uuid4().hex[:8]
    actions_topic, steps_topic, now = f"actions-{tag}", f"steps-{tag}", int(time.time() * 1000)
    resume = action(f"inv-{tag}-1", now)
    restart = action(f"inv-{tag}-2", now, action_id=f"inv-{tag}-2:6", action="restart", reason="BOUNDED_STOP:stop_condition",
                     not_before_ts=now + 3_000, next_policy=TIGHTER)
    escalate = action(f"inv-{tag}-3", now, action_id=f"inv-{tag}-3-a3:5", run_id=f"inv-{tag}-3-a3", attempt=3,
                      next_attempt=None, action="escalate", reason="attempts_exhausted", escalate_to="oncall")
    aborted = action(f"inv-{tag}-4", now)
    asyncio.run(create_topic(kafka.bootstrap, actions_topic, 3))
    asyncio.run(create_topic(kafka.bootstrap, steps_topic, 1))
    asyncio.run(produce(kafka.bootstrap, actions_topic, [resume, restart, escalate], aborted=[aborted]))
    asyncio.run(produce(kafka.bootstrap, actions_topic, [resume]))  # the same action again: dropped by its id
    proc = subprocess.run(
        [node, str(ON_ACTION), "--kafka", kafka.bootstrap, "--actions-topic", actions_topic, "--steps-topic", steps_topic,
         "--group", f"g-{tag}", "--expect", "3"],
        cwd=EMITTER, capture_output=True, text=True, timeout=200, env={**os.environ, "NODE_NO_WARNINGS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    handled = [json.loads(line) for line in proc.stdout.splitlines()]
    assert sorted(h["action_id"] for h in handled) == sorted([resume.action_id, restart.action_id, escalate.action_id])
    by_id = {h["action_id"]: h for h in handled}
    assert by_id[restart.action_id]["at"] >= restart.not_before_ts, "the restart was handed over before it was due"
    assert json.loads(proc.stderr.splitlines()[-1])["actions"]["repeats"] == 1
    started = {e.run_id: e for e in asyncio.run(run_starteds(kafka.bootstrap, steps_topic, 2))}
    assert set(started) == {f"inv-{tag}-1-a2", f"inv-{tag}-2-a2"}
    first, second = started[f"inv-{tag}-1-a2"], started[f"inv-{tag}-2-a2"]
    assert (first.job_id, first.attempt, first.recovers) == (resume.job_id, 2, resume.run_id)
    assert (second.job_id, second.attempt, second.recovers) == (restart.job_id, 2, restart.run_id)
    assert first.policy.recovery.max_attempts == 3
    assert (second.policy.version, second.policy.stop_when, second.policy.recovery.max_attempts) == (
        "v1-tight", (StepCount(count=4),), 3)
