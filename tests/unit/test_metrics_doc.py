"""docs/operations.md's metrics table names every metric the worker exports, and nothing it does not."""

from __future__ import annotations

import re
from pathlib import Path

from loopwarden.engine.metrics import EngineMetrics
from loopwarden.stages import stage_metrics
from loopwarden.stages.health.metrics import HealthMetrics


def worker_metrics() -> EngineMetrics:
    """The series of a worker that runs the bridge beside (`worker --otel`): the engine's and every stage's."""
    metrics = EngineMetrics()
    stage_metrics(metrics)
    return metrics


def test_the_operations_doc_lists_every_loopwarden_metric() -> None:
    """docs/operations.md's metrics table names exactly the loopwarden_* metrics the worker exports."""
    readme = (Path(__file__).resolve().parents[2] / "docs" / "operations.md").read_text()
    section = readme.split("\n## Metrics", 1)[1].split("\n## ", 1)[0]
    documented = set(re.findall(r"^\| `(loopwarden_[a-z_]+)` \|", section, flags=re.M))
    exported = {family.name for family in worker_metrics().registry.collect() if family.name.startswith("loopwarden_")}
    # prometheus-client drops a counter's _total suffix from the family name
    exported = {n + "_total" if f"`{n}_total`" in section else n for n in exported}
    assert documented == exported, (exported - documented, documented - exported)
    assert "process_resident_memory_bytes" in {s.name for f in EngineMetrics().registry.collect() for s in f.samples}


def test_agent_labels_are_bounded() -> None:
    """The first AGENT_LABELS_MAX names are labels; later ones, and names that would collide with the
    buckets, count as "other"; no name is "none"."""
    from loopwarden.stages.health.metrics import AGENT_LABELS_MAX

    m = HealthMetrics(EngineMetrics())
    labels = [m.agent_label(f"agent-{i}") for i in range(AGENT_LABELS_MAX + 10)]
    assert labels[:AGENT_LABELS_MAX] == [f"agent-{i}" for i in range(AGENT_LABELS_MAX)]
    assert set(labels[AGENT_LABELS_MAX:]) == {"other"}
    assert m.agent_label("agent-3") == "agent-3"  # a known name stays itself
    assert (m.agent_label(None), m.agent_label("other"), m.agent_label("none")) == ("none", "other", "other")
