"""The OpenTelemetry bridge's settings: the Collector's topic, its partitions, how long a run's late spans wait.

They extend the engine's (:class:`~loopwarden.engine.config.EngineConfig`). Where the bridge's run events go
is a setting of the stage that reads them (:class:`RunEvents`), handed to the bridge beside its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from loopwarden.engine.config import EngineConfig, check_ranges

# Settings that must lie in a range (bounds included): name -> (lowest, highest).
_RANGES = {"otel_partitions": (1, 10_000), "otel_end_grace_s": (0, 600)}


@dataclass(frozen=True)
class OtelConfig(EngineConfig):
    """The engine's knobs and the bridge's. Each has an env var ``LOOPWARDEN_<NAME>``."""

    # The OpenTelemetry bridge (`loopwarden bridge`, `worker --otel`): the topic the Collector's Kafka
    # exporter writes (otlp_proto or otlp_json, one trace per message, keyed by trace id).
    otel_topic: str = "otlp_spans"
    # Partitions of the otel topic and of the bridge's changelog (created with this many when missing).
    otel_partitions: int = 8
    # How long the bridge holds a run that ended in error, cancelled, after a tool request or without a
    # recorded finish reason, for its spans that end after its run span (a cancelled tool's); a run that
    # ended cleanly is published at once.
    otel_end_grace_s: float = 2.0

    def topics(self) -> dict[str, str]:
        return {**super().topics(), "otel_topic": self.otel_topic}

    def __post_init__(self) -> None:
        super().__post_init__()
        check_ranges(self, _RANGES)


def otel_topics(config: OtelConfig) -> list[str]:
    """The Collector's topic and the bridge's changelog (its stage's app id is ``<app id>-otel``)."""
    return [config.otel_topic, f"{config.app_id}-otel-traces-changelog"]


def otel_problem(partitions: int, counts: dict[str, int]) -> str:
    """One line: the bridge's topics have ``counts``, not ``partitions`` each; what to run."""
    ns = set(counts.values())
    keep = f"set LOOPWARDEN_OTEL_PARTITIONS={min(ns)} to use them as they are, or " if len(ns) == 1 else ""
    return (f"the bridge's topics must have otel_partitions={partitions} partitions each, got "
            + ", ".join(f"{t}={n}" for t, n in counts.items())
            + f": {keep}run `loopwarden topics repair --otel` (it recreates those holding no records)")


class RunEvents(Protocol):
    """Where the bridge's run events go, as the stage that reads them is configured (the health stage's
    steps topic and dead-letter topic), and how far ahead of the clock an event may be stamped."""

    steps_topic: str
    deadletter_topic: str
    max_future_skew_s: float
