"""A stage is its own folder plus one line in loopwarden.stages.STAGES: its settings and series join the process's."""

from __future__ import annotations

import ast
from dataclasses import fields
from pathlib import Path

from loopwarden.config import Config, joined_config, listed_fields
from loopwarden.engine.config import from_env
from loopwarden.engine.metrics import EngineMetrics
from loopwarden.stages import STAGES, Registered, stage_metrics

ENGINE = Path(__file__).resolve().parents[2] / "loopwarden" / "engine"
COUNTER = {**STAGES, "counter": Registered("tests.engine.counter_stage:CounterConfig")}


def test_the_process_config_is_the_registered_stages_configs_joined() -> None:
    """Config's bases are the registered stages' config classes, in the order they are registered."""
    assert Config.__bases__ == tuple(reg.config_class() for reg in STAGES.values())


def test_a_stage_registered_with_one_line_is_configured_from_the_environment() -> None:
    """Registering the counter stage (tests/engine/counter_stage.py) makes LOOPWARDEN_COUNTER_IN a setting of the
    process, validated with the others, listed after them in docs order, and leaves every other default as it is."""
    joined = joined_config(COUNTER)
    config = from_env(environ={"LOOPWARDEN_COUNTER_IN": "clicks", "LOOPWARDEN_STEPS_TOPIC": "s"}, kind=joined)
    assert (config.counter_in, config.counter_out, config.steps_topic) == ("clicks", "counter.out", "s")
    assert [f.name for f in listed_fields(joined)][-2:] == ["counter_in", "counter_out"]
    assert {f.name for f in fields(joined)} - {f.name for f in fields(Config)} == {"counter_in", "counter_out"}


def test_every_registered_stages_series_join_the_process_registry() -> None:
    """stage_metrics makes each registered stage's metrics in the engine's registry; a stage without metrics of its
    own adds none."""
    engine = EngineMetrics()
    made = stage_metrics(engine, COUNTER)
    assert set(made) == {"health", "otel"} and all(m.registry is engine.registry for m in made.values())


def test_the_engine_reads_a_task_only_through_the_stage_contract() -> None:
    """No module of the engine guesses at a task's attributes (getattr/hasattr on a task): the hooks it calls,
    timers (fold's punctuate) and the pre-fold hold (Task.settling), are declared in engine/stage.py."""
    guessed = []
    for path in ENGINE.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and getattr(node.func, "id", None) in ("getattr", "hasattr")
                    and "task" in ast.unparse(node.args[0])):
                guessed.append(f"{path.name}:{node.lineno} {ast.unparse(node)}")
    assert not guessed, guessed
