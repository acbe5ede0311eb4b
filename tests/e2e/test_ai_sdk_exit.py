"""A process that publishes through the emitter's KafkaSink and exits without close(): bounded, loss counted.

`emitters/ai-sdk/test/helpers/exit-without-close.mjs` runs three real AI SDK agent runs (nine
events) and then just ends. Whatever the broker does — nothing listening, a TCP server that never
answers, a healthy broker — the process must end within the publisher's exit budget (exitFlushMs
1.5 s there), and what could not be sent must be counted and logged with its runs.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import uuid

import pytest

from tests.e2e.test_ai_sdk_agents import EMITTER, _built, _node
from tests.integration.harness import read_topic, run, unique_config

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

EXIT = EMITTER / "test" / "helpers" / "exit-without-close.mjs"
# exitFlushMs 1.5 s, plus process start-up noise on a loaded 2-core machine
BOUND_S = 4.0


def _exit_after(args: list[str]) -> tuple[float, dict, str]:
    """Run the child; seconds from its 'done' line to its exit, the line, and its stderr."""
    node = _node()
    _built(node)
    proc = subprocess.Popen([node, str(EXIT), *args], cwd=EMITTER, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={**os.environ, "NODE_NO_WARNINGS": "1"})
    try:
        line = proc.stdout.readline()
        done = time.monotonic()
        proc.wait(timeout=120)
        exited = time.monotonic()
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, proc.stderr.read()
    return exited - done, json.loads(line), proc.stderr.read()


@pytest.mark.parametrize("mode", ["refused", "hung"])
def test_a_broker_in_trouble_never_holds_the_process_and_the_loss_is_logged(mode: str) -> None:
    """Nothing listening, or a broker that never answers: exit within the bound, the 9 events logged as lost."""
    after_s, done, stderr = _exit_after([mode])
    assert after_s < BOUND_S, f"the process took {after_s:.1f} s to exit"
    assert done["stats"]["enqueued"] == 9 and done["stats"]["published"] == 0
    lines = [line for line in stderr.splitlines() if line.startswith("loopwarden: closing: ")]
    assert len(lines) == 1, stderr
    assert "9 event(s) of 3 run(s) were lost" in lines[0]
    for i in range(3):
        assert f'"exit-{mode}-{i}" (3)' in lines[0]


def test_a_healthy_broker_never_holds_the_process_and_everything_arrives(kafka) -> None:
    """A connected producer to a healthy broker does not keep the process alive; all 9 events arrive."""
    config = unique_config(kafka.bootstrap)
    topic = f"exit-steps-{uuid.uuid4().hex[:8]}"
    after_s, done, stderr = _exit_after(["healthy", kafka.bootstrap, topic])
    assert after_s < BOUND_S, f"the process took {after_s:.1f} s to exit"
    assert "loopwarden: closing:" not in stderr
    assert done["stats"]["published"] == done["stats"]["enqueued"] == 9
    records = run(read_topic(config, topic, lambda rs: len(rs) >= 9, timeout_s=60))
    runs = sorted({json.loads(r.value)["run_id"] for r in records})
    assert runs == ["exit-healthy-0", "exit-healthy-1", "exit-healthy-2"] and len(records) == 9
