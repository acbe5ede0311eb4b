"""The stages the engine runs, one folder each: its task and fold, its state codec, its config and metrics.

:data:`STAGES` registers them, one line each: where the stage's config class and its metrics class are
declared. A registered stage's settings join the process's ``Config`` (``loopwarden/config.py``: every one
an environment variable, a row of docs/configuration.md) and its series the process's registry
(:func:`stage_metrics`). Entries name their classes by ``module:Class`` so that registering imports
nothing: the stages' modules import ``loopwarden.config`` in turn.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import import_module
from typing import Any


@dataclass(frozen=True)
class Registered:
    """A stage as a process knows it: its config class (an ``EngineConfig`` subclass) and its metrics class
    (made with the process's ``EngineMetrics``; None: the stage records only the engine's series)."""

    config: str  # "module:Class"
    metrics: str | None = None  # "module:Class"

    def config_class(self) -> type:
        return _load(self.config)

    def metrics_class(self) -> type | None:
        return None if self.metrics is None else _load(self.metrics)


STAGES: dict[str, Registered] = {
    "health": Registered("loopwarden.stages.health.config:HealthConfig", "loopwarden.stages.health.metrics:HealthMetrics"),
    "otel": Registered("loopwarden.stages.otel.config:OtelConfig", "loopwarden.stages.otel.metrics:OtelMetrics"),
}


def stage_metrics(engine_metrics: Any, stages: dict[str, Registered] = STAGES) -> dict[str, Any]:
    """Each registered stage's metrics, made in ``engine_metrics``' registry (a process that runs them all)."""
    made = {name: (cls(engine_metrics) if (cls := reg.metrics_class()) else None) for name, reg in stages.items()}
    return {name: m for name, m in made.items() if m is not None}


def _load(path: str) -> type:
    module, _, name = path.partition(":")
    return getattr(import_module(module), name)
