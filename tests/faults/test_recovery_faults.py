"""Bounded recovery under SIGKILL (docs/recovery.md): a worker killed again and again while runs with a recovery
policy flow publishes every action once on agent.actions (read_committed), the actions replay decides."""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path

import pytest

from tests.integration.harness import read_all, run, sigkill_while_publishing, tick, unique_config
from tests.recovery_fleet import recovery_fleet
from tests.recovery_kafka import ADVANCE_MS, differences, messages, policies_file, read_actions, replay_actions

pytestmark = pytest.mark.timeout(400)
TIMES = {"ts", "not_before_ts"}
# make test: 400 runs; make soak: 1,000 (LOOPWARDEN_FAULT_RECOVERY_RUNS).
RUNS = int(os.environ.get("LOOPWARDEN_FAULT_RECOVERY_RUNS", "400"))


def test_sigkill_while_runs_with_a_policy_flow_publishes_each_action_once(kafka, tmp_path: Path) -> None:
    """A worker SIGKILLed every 1.5-3 s (>= 5 kills) while RUNS runs with a recovery policy are published:
    agent.actions holds every action_id exactly once, and the actions equal replay's but for their times."""
    events = recovery_fleet(RUNS, seed=9)
    expected = replay_actions(events)
    config = unique_config(kafka.bootstrap, recovery_policies=policies_file(tmp_path))
    worker, kills = sigkill_while_publishing(config, tmp_path, messages(events), chunk=150, min_kills=5,
                                             batch_max_records=200)
    try:
        run(tick(worker.config, max(e["ts"] for e in events) + ADVANCE_MS))
        read_actions(worker.config, len(expected), timeout_s=240)
        got = [json.loads(r.value) for r in run(read_all(worker.config, worker.config.actions_topic))]
    finally:
        worker.stop()
    repeated = [k for k, n in Counter(a["action_id"] for a in got).items() if n > 1]
    print(f"\nRECOVERY-FAULT-FIGURES kills={kills} runs={RUNS} actions={len(got)} expected={len(expected)} "
          f"repeated={len(repeated)}")
    assert not repeated, f"{len(repeated)} action ids repeated, e.g. {repeated[:3]}"
    # A restarted worker may apply an event later than replay places it (it counts from the event clock it
    # restored: docs/contract.md section 5), so a timer's deadline, and the ts of the action it causes, can move;
    # which actions, for which attempts, decided how, may not.
    moved = {k: v for k, v in differences(got, expected).items() if not isinstance(v, dict) or v.keys() - TIMES}
    assert not moved, moved

