"""A loopwarden process's settings: the engine's and those of every registered stage, in one frozen value.

Each part is declared where it belongs: :class:`~loopwarden.engine.config.EngineConfig` in the engine, a stage's
in its folder (``loopwarden.stages.health.config``, ``loopwarden.stages.otel.config``). :class:`Config` joins
the configs of the stages registered in ``loopwarden.stages.STAGES``, so ``LOOPWARDEN_<NAME>`` and a worker's
flags set any of them; the engine is handed the whole and reads only its own fields. ``loopwarden
config-doc`` writes docs/configuration.md from them: :data:`LISTED` first, in its order, then any other
setting in the order its stage declares it.
"""

from __future__ import annotations

from dataclasses import Field, dataclass, fields

from loopwarden.engine import config as engine_config
from loopwarden.engine.config import EngineConfig, env_name
from loopwarden.stages import STAGES, Registered
from loopwarden.stages.health.config import CLOCKS

__all__ = ["CLOCKS", "LISTED", "Config", "EngineConfig", "env_name", "from_env", "joined_config", "listed_fields"]


def joined_config(stages: dict[str, Registered] = STAGES) -> type:
    """One frozen dataclass whose bases are the stages' config classes, in the order they are registered."""
    bases = tuple(reg.config_class() for reg in stages.values())
    namespace = {"__module__": __name__,
                 "__doc__": "Every knob of a loopwarden process: the engine's and each registered stage's."}
    return dataclass(frozen=True)(type("Config", bases, namespace))


Config = joined_config()


# The order an operator reads the settings in (docs/configuration.md, `loopwarden worker --help`): the broker
# and the topics first, then partitions and the store, HTTP, the board, the bridge, the loop's tuning, security.
LISTED = (
    "broker", "app_id", "steps_topic", "outcomes_topic", "trusted_outcomes_topic", "trusted_outcomes_without_acl",
    "health_topic", "deadletter_topic", "actions_topic", "recovery_policies", "ticks_topic", "partitions",
    "replication", "store", "data_dir",
    "web_host", "web_port", "canonical_url", "token", "http_header_timeout_s", "http_max_header_bytes",
    "http_max_connections", "board_port", "board_lookback_s", "board_settled_s", "board_max_runs",
    "board_users", "board_signing_key",
    "states_doc_url", "board_in_worker", "otel_topic", "otel_partitions", "otel_end_grace_s", "clock",
    "tick_interval_s", "shutdown_timeout_s", "batch_max_records", "batch_wait_ms", "input_buffer_max_bytes",
    "commit_gap_ms", "commit_offsets_ms", "align_max_ms", "topology_check_s", "expand_window_s",
    "expand_settle_ms", "stall_timeout_s", "max_message_bytes", "session_timeout_s", "retention_s",
    "max_future_skew_s", "seq_memory_s", "malloc_trim_s", "log_level", "security_protocol", "sasl_mechanism",
    "sasl_username", "sasl_password", "ssl_cafile", "ssl_certfile", "ssl_keyfile", "ssl_check_hostname",
)


def listed_fields(config: type = Config) -> list[Field]:
    """``config``'s fields: those in :data:`LISTED` in its order, then the others (a stage registered since, a
    setting added since) in the order their classes declare them. A name in LISTED that is no setting is an
    error."""
    by_name = {f.name: f for f in fields(config)}
    if set(LISTED) - set(by_name):
        raise ValueError(f"loopwarden.config.LISTED names no such setting: {sorted(set(LISTED) - set(by_name))}")
    return [by_name[name] for name in LISTED] + [f for name, f in by_name.items() if name not in LISTED]


def from_env(overrides: dict | None = None, environ: dict | None = None) -> Config:  # type: ignore[valid-type]
    """Build a Config from ``LOOPWARDEN_*`` variables, then ``overrides`` (flags; None = unset)."""
    return engine_config.from_env(overrides, environ, kind=Config)
