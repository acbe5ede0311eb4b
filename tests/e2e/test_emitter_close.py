"""The emitter's clean close is quiet: no kafkajs ERROR line when `close()` ends a healthy connection."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from tests.e2e.test_ai_sdk_agents import EMITTER, _built, _node

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]


def test_a_clean_close_prints_nothing_but_the_stats(kafka) -> None:
    """Five receipts published to a real broker, then `lw.close()`: the stats show all five published, and
    nothing else is printed (no `kafkajs ERROR [Connection] Connection error: KafkaSink closed`)."""
    node = _node()
    _built(node)
    from tests.integration.harness import run, unique_config
    from loopwarden.stages.topics import ensure_topics

    config = unique_config(kafka.bootstrap)
    run(ensure_topics(config))  # as in a deployment: the topics exist (auto-creation logs of its own)
    topic = config.outcomes_topic
    proc = subprocess.run([node, "test/e2e/close-quietly.mjs", kafka.bootstrap, topic], cwd=EMITTER,
                          capture_output=True, text=True, timeout=90, env={**os.environ, "NODE_NO_WARNINGS": "1"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    assert len(lines) == 1, proc.stdout
    stats = json.loads(lines[0])
    assert (stats["enqueued"], stats["published"], stats["dropped"]) == (5, 5, 0), stats
    assert proc.stderr == "", proc.stderr
