"""Prometheus metrics of the OpenTelemetry bridge: spans by what became of them, events published, traces held.

Registered beside the engine's (:class:`~loopwarden.engine.metrics.EngineMetrics`, in its registry).
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge

from loopwarden.engine.metrics import EngineMetrics


class OtelMetrics:
    """The bridge's series (its dead letters are the engine's ``invalid``, topic role ``spans``)."""

    def __init__(self, engine: EngineMetrics) -> None:
        self.registry = r = engine.registry
        self.child = engine.child
        self.invalid = engine.invalid
        self.otel_spans = Counter("loopwarden_otel_spans_total",
                                  "Spans the OpenTelemetry bridge read, by outcome (spans: folded; the others: counted "
                                  "and ignored, or traces dropped).", ["outcome"], registry=r)
        self.otel_events = Counter("loopwarden_otel_events_total",
                                   "Events the OpenTelemetry bridge published on agent.steps, by type.", ["type"],
                                   registry=r)
        self.otel_traces = Gauge("loopwarden_otel_traces", "Traces the OpenTelemetry bridge holds, per owned partition.",
                                 ["partition"], registry=r)
