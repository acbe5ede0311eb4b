"""Real AI SDK agents through a sink that cannot keep up → `loopwarden replay`: loss is never silent.

`emitters/ai-sdk/test/e2e/slow-sink.mjs` runs 200 real ToolLoopAgents at once through a sink that
takes 20 ms per batch behind a queue of 40 records, so most events are lost. The emitter reports
each run's loss (`events_dropped`); replayed, every run that lost events must end UNCERTAIN with
`producer_dropped` (never STUCK, never blamed on the agent), and the reported counts must add up
to the client's own `stats().dropped`.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from tests.e2e.test_ai_sdk_agents import EMITTER, LOOPWARDEN, _built, _node

pytestmark = pytest.mark.e2e

SLOW_SINK = EMITTER / "test" / "e2e" / "slow-sink.mjs"


@pytest.fixture(scope="module")
def lossy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    node = _node()
    _built(node)
    out = tmp_path_factory.mktemp("ai-sdk-loss")
    proc = subprocess.run([node, str(SLOW_SINK), "--out", str(out), "--runs", "200", "--queue", "40"], cwd=EMITTER,
                          capture_output=True, text=True, timeout=300, env={**os.environ, "NODE_NO_WARNINGS": "1"})
    assert proc.returncode == 0, f"slow-sink.mjs failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    return out


def test_every_run_that_lost_events_ends_uncertain_producer_dropped(lossy: Path) -> None:
    """No run that lost events ends STUCK or blamed on the agent; the counts match stats().dropped."""
    meta = json.loads((lossy / "stats.json").read_text())
    events = [json.loads(line) for line in (lossy / "events.jsonl").read_text().splitlines()]
    reported: Counter = Counter()
    for e in events:
        if e["type"] == "events_dropped":
            reported[e["run_id"]] += e["count"]
    assert meta["stats"]["dropped"] > 100, meta["stats"]
    assert sum(reported.values()) == meta["stats"]["dropped"]
    assert meta["stats"]["pending"] == 0 and meta["logLines"] >= 1

    proc = subprocess.run([str(LOOPWARDEN), "replay", str(lossy / "events.jsonl"), "--advance-s", "1800"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    paths: dict[str, list[str]] = defaultdict(list)
    last: dict[str, dict] = {}
    for line in proc.stdout.splitlines():
        t = json.loads(line)
        paths[t["run_id"]].append(t["to_state"])
        last[t["run_id"]] = t
    assert set(last) == set(meta["runs"]), "every run shows up, even one whose every event was lost"
    wrong = {run: (last[run]["to_state"], last[run]["reason"]) for run in reported
             if (last[run]["to_state"], last[run]["reason"]) != ("UNCERTAIN", "producer_dropped")}
    assert not wrong, wrong
    assert all(last[run]["evidence"]["events_dropped"] == n for run, n in reported.items())
    assert [run for run, path in paths.items() if "STUCK" in path or "FAILED" in path] == []
