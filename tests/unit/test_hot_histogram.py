"""The worker's hot-path histogram is exposed exactly as prometheus_client's Histogram would expose it."""

from __future__ import annotations

import random

from prometheus_client import CollectorRegistry, Histogram, generate_latest

from loopwarden.engine.metrics import EngineMetrics, HotHistogram
from loopwarden.stages.health.metrics import HealthMetrics

BUCKETS = (0.0025, 0.005, 0.01, 0.1, 1, 2.5, 60)


def _lines(registry: CollectorRegistry) -> list[str]:
    return [line for line in generate_latest(registry).decode().splitlines() if "_created" not in line]


def test_a_hot_histogram_exposes_what_a_prometheus_histogram_of_the_same_values_does() -> None:
    """Same buckets (values on a bound, below the first, past the last), count, sum and help text."""
    rng = random.Random(3)
    values = [0.0, 0.0025, 0.005, 0.00999, 1.0, 59.9, 60.0, 61.0, 1e6] + [rng.expovariate(2.0) for _ in range(2000)]
    ref_registry, hot_registry = CollectorRegistry(), CollectorRegistry()
    ref = Histogram("lw_test_seconds", "What it measures.", buckets=BUCKETS, registry=ref_registry)
    hot = HotHistogram("lw_test_seconds", "What it measures.", BUCKETS, hot_registry)
    for v in values:
        ref.observe(v)
        hot.observe(v)
    assert _lines(hot_registry) == _lines(ref_registry)
    created = [line for line in generate_latest(hot_registry).decode().splitlines() if line.startswith("lw_test_seconds_created")]
    assert len(created) == 1


def test_the_workers_latency_histograms_are_the_hot_ones_and_exported() -> None:
    """The two per-transition histograms are HotHistograms, in the registry /metrics serves."""
    m = HealthMetrics(EngineMetrics())
    m.latency.observe(0.2)
    m.timer_latency.observe(3.0)
    assert isinstance(m.latency, HotHistogram) and isinstance(m.timer_latency, HotHistogram)
    text = generate_latest(m.registry).decode()
    assert 'loopwarden_event_to_transition_seconds_bucket{le="0.25"} 1.0' in text
    assert "loopwarden_timer_to_transition_seconds_count 1.0" in text
