"""docs/first-receipt.md as a newcomer follows it: its shell blocks, run as written and in order against a
real broker, take one run to VERIFIED_COMPLETE and one to FALSE_COMPLETE; its Python snippet runs too."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from dev.localkafka import free_port
from tests.conftest import REPO

pytestmark = [pytest.mark.integration, pytest.mark.timeout(400)]
DOC = REPO / "docs" / "first-receipt.md"
DOC_BROKER = "127.0.0.1:9092"


def blocks(lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```", DOC.read_text(), flags=re.M | re.S)


def test_the_walkthrough_takes_a_run_to_verified_complete_and_one_to_false_complete(kafka, tmp_path: Path) -> None:
    """The doc's shell blocks, joined in order and run by bash with only the broker's address (and the
    verifier's port) replaced: the run whose file exists ends VERIFIED_COMPLETE, the one whose file is
    missing FALSE_COMPLETE, each decided by the verifier's signed receipt."""
    script = "\n".join(blocks("sh"))
    assert DOC_BROKER in script and "web_port = 6068" in script
    script = script.replace(DOC_BROKER, kafka.bootstrap).replace("web_port = 6068", f"web_port = {free_port()}")
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOOPWARDEN_")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"  # `loopwarden` of this checkout
    env["LOOPWARDEN_WEB_PORT"] = str(free_port())  # the worker's default 6066 may be taken on a shared machine
    proc = subprocess.Popen(["bash", "-e", "-c", script], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=300)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # the worker and the verifier, should the last block not have run
        except ProcessLookupError:
            pass
    logs = "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}" for p in tmp_path.glob("*.log"))
    assert proc.returncode == 0, f"{err}\n{logs}"
    states = {run: re.findall(rf"{run}\s.*-> (\S+)", out) for run in ("first-run-1", "first-run-2")}
    assert states["first-run-1"] == ["RUNNING", "VERIFYING", "VERIFIED_COMPLETE"], (out, logs)
    assert states["first-run-2"] == ["RUNNING", "VERIFYING", "FALSE_COMPLETE"], (out, logs)


def test_the_walkthroughs_python_snippet_runs_as_written(kafka) -> None:
    """The doc's Python snippet (imports included) runs against a broker and publishes its expectation."""
    (snippet,) = blocks("python")
    assert DOC_BROKER in snippet
    done = subprocess.run([sys.executable, "-c", snippet.replace(DOC_BROKER, kafka.bootstrap)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
