"""`loopwarden replay --actions` (docs/recovery.md): a team tries a recovery policy on past events offline."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.recovery_fleet import DEFAULTS, recovery_fleet

LW = [sys.executable, "-m", "loopwarden.cli"]
REPO = Path(__file__).resolve().parents[2]


def _run(tmp_path: Path, *extra: str) -> subprocess.CompletedProcess:
    events = tmp_path / "events.jsonl"
    events.write_text("".join(json.dumps(e) + "\n" for e in recovery_fleet(12)))
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("LOOPWARDEN_RECOVERY_POLICIES", None)
    return subprocess.run([*LW, "replay", str(events), "--advance-s", "3600", *extra], capture_output=True,
                          text=True, env=env)


def test_actions_follow_the_transition_that_caused_them(tmp_path: Path) -> None:
    """With --actions each recovery_action line comes right after its transition, with the policies file's defaults."""
    policies = tmp_path / "recovery.json"
    policies.write_text(json.dumps(DEFAULTS))
    proc = _run(tmp_path, "--actions", "--recovery-policies", str(policies))
    assert proc.returncode == 0, proc.stderr
    lines = [json.loads(line) for line in proc.stdout.splitlines()]
    actions = [(i, a) for i, a in enumerate(lines) if a["type"] == "recovery_action"]
    assert {a["action"] for _, a in actions} >= {"resume", "restart", "escalate"}
    for i, a in actions:
        before = lines[i - 1]
        assert f"{before['run_id']}:{before['seq']}" == a["action_id"] == before["evidence"]["action_id"]
        assert a["agent"] == before["agent"], "an action names the agent of the run it answers"
    # the invoice agent's runs declare no policy: their actions come from the file
    assert any(a["run_id"] in {line["run_id"] for line in lines if line.get("agent") == "invoice"} for _, a in actions)


def test_without_actions_the_output_is_transitions_only(tmp_path: Path) -> None:
    """Without --actions replay prints transitions only, though the runs' policies decide actions."""
    proc = _run(tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert {json.loads(line)["type"] for line in proc.stdout.splitlines()} == {"health_transition"}


def test_a_bad_policies_file_stops_replay_naming_the_agent_and_field(tmp_path: Path) -> None:
    """A policies file with a misspelt field stops replay at once with one line naming agent and field."""
    policies = tmp_path / "recovery.json"
    policies.write_text('{"invoice": {"max_attempt": 3}}')
    proc = _run(tmp_path, "--actions", "--recovery-policies", str(policies))
    assert proc.returncode != 0 and proc.stdout == ""
    assert proc.stderr.strip() == f"loopwarden replay: {policies}: agent 'invoice': Object contains unknown field `max_attempt`"
