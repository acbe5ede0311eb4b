"""The health stage's settings: its topics, its clock and how long it keeps runs, the board that reads it.

They extend the engine's (:class:`~loopwarden.engine.config.EngineConfig`); every one is an environment
variable ``LOOPWARDEN_<NAME>`` and most a flag of ``loopwarden worker`` (docs/configuration.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from loopwarden.engine.config import TOPIC, EngineConfig, check_ranges
from loopwarden.engine.exceptions import ConfigError

CLOCKS = ("wall", "event")

# Settings that must lie in a range (bounds included): name -> (lowest, highest).
_RANGES = {
    "board_port": (0, 65535), "board_max_runs": (100, 10_000_000), "expand_window_s": (0, 86400),
    "expand_settle_ms": (0, 60_000),
}


@dataclass(frozen=True)
class HealthConfig(EngineConfig):
    """The engine's knobs and the health stage's. Each has an env var ``LOOPWARDEN_<NAME>``."""

    # Input: run_started, step_finished, run_ended, approval_* (keyed by run id).
    steps_topic: str = "agent.steps"
    # Input: outcome receipts (keyed by run id; co-partitioned with the steps).
    outcomes_topic: str = "agent.outcomes"
    # Input, when set: outcome receipts that only the verifiers' principals may write (Kafka ACLs), trusted by
    # this channel without a per-message signature check (docs/receipts.md); e.g. `agent.outcomes.verified`.
    trusted_outcomes_topic: str | None = None
    # Start even though the cluster has no authorizer (anyone could write the trusted topic): single-tenant
    # dev and the bench only.
    trusted_outcomes_without_acl: bool = False
    # Output: health transitions (read it with isolation.level=read_committed).
    health_topic: str = "agent.health"
    # Output: bad input, byte for byte (spans: a content-free description), with the error in headers
    # (`loopwarden deadletters` reads it).
    deadletter_topic: str = "agent.deadletter"
    # Output: recovery actions (docs/recovery.md), keyed by job id, committed with the transition that caused each
    # (read it with isolation.level=read_committed; the fleet carries them out).
    actions_topic: str = "agent.actions"
    # A JSON or TOML file mapping agent name (or `*`) to its default recovery policy (docs/recovery.md); a run's
    # own `policy.recovery` comes first. A bad file stops the worker at start, naming the agent and the field.
    recovery_policies: str | None = None
    # Internal: one tick per owned partition drives timers in stream order.
    ticks_topic: str = "loopwarden.ticks"
    # The runs board (`loopwarden board`, loopwarden.api.board): the port it listens on.
    board_port: int = 6067
    # How far back the board reads agent.health when it starts.
    board_lookback_s: float = 86400.0
    # How long a settled run (VERIFIED_COMPLETE, BOUNDED_STOP) stays on the board.
    board_settled_s: float = 3600.0
    # Runs the board holds at most (the longest-settled go first, then the quiet longest).
    board_max_runs: int = 100_000
    # The board's people, `NAME=TOKEN[,NAME=TOKEN...]` (each token 16+ characters; environment only): a user
    # signed in with their token may act on runs, and the board names them as the action's actor.
    board_users: str | None = field(default=None, repr=False)
    # The key file (`loopwarden keys new`) the board signs its users' operator actions with; its key must be
    # in the workers' LOOPWARDEN_TRUSTED_VERIFIERS. Unset: the board only shows.
    board_signing_key: str | None = None
    # Where each state's doc lives (the board and /runs link `<this>#<state>`).
    states_doc_url: str = "docs/states.md"
    # The worker also serves the board at /board/ (its own reader of agent.health, every partition).
    board_in_worker: bool = False
    # Timers on processing time (`wall`) or on the event-time clock (`event`: steps' and receipts' ts, and explicit ticks).
    clock: str = "wall"
    # After `loopwarden topics expand`, for this long (s), a moved run's records sent straight to its new
    # partition wait there until its old partition has forwarded the records producers still hashing over
    # the old count sent it (so they are applied in the order produced); longer than metadata.max.age.ms.
    expand_window_s: float = 600.0
    # The clock skew and time in flight allowed between a producer's records to the old and the new partition (ms).
    expand_settle_ms: int = 1000
    # Settled runs and orphan receipts are dropped after this long without events.
    retention_s: float = 7 * 86400
    # An event or tick stamped more than this ahead of the worker's wall clock is dead-lettered.
    max_future_skew_s: float = 300.0
    # A dropped run's last seq is kept this long (a tomb of ~70 B), so its run id's seq never repeats.
    seq_memory_s: float = 30 * 86400

    def topics(self) -> dict[str, str]:
        verified = self.trusted_outcomes_topic
        return {"steps_topic": self.steps_topic, "outcomes_topic": self.outcomes_topic,
                "health_topic": self.health_topic, "deadletter_topic": self.deadletter_topic,
                "actions_topic": self.actions_topic, "ticks_topic": self.ticks_topic, **super().topics(),
                **({"trusted_outcomes_topic": verified} if verified is not None else {})}

    def __post_init__(self) -> None:
        if self.trusted_outcomes_topic is not None and not TOPIC.match(self.trusted_outcomes_topic):
            raise ConfigError(f"trusted_outcomes_topic: {self.trusted_outcomes_topic!r} is not a valid Kafka topic "
                              "name ([A-Za-z0-9._-], 1-249 chars)")
        super().__post_init__()
        check_ranges(self, _RANGES)
        if self.clock not in CLOCKS:
            raise ConfigError(f"clock: {self.clock!r} must be one of {', '.join(CLOCKS)}")
        if not 0 <= self.board_lookback_s <= 365 * 86400:
            raise ConfigError(f"board_lookback_s: {self.board_lookback_s} must be between 0 and 1 year in seconds")
        if not 1 <= self.board_settled_s <= 30 * 86400:
            raise ConfigError(f"board_settled_s: {self.board_settled_s} must be between 1 and 30 days in seconds")
        if not self.states_doc_url or any(c in self.states_doc_url for c in "\"<> #"):
            raise ConfigError(f"states_doc_url: {self.states_doc_url!r} must be a URL or path without spaces, "
                              "quotes, <, > or # (the board appends #<state>)")
        if self.retention_s <= 0:
            raise ConfigError(f"retention_s: {self.retention_s} must be > 0")
        if not 1 <= self.max_future_skew_s <= 10 * 365 * 86400:
            raise ConfigError(f"max_future_skew_s: {self.max_future_skew_s} must be between 1 and 10 years in seconds")
        if not 0 <= self.seq_memory_s <= 10 * 365 * 86400:
            raise ConfigError(f"seq_memory_s: {self.seq_memory_s} must be between 0 and 10 years in seconds")

    @property
    def changelog_topic(self) -> str:
        """The compacted topic that holds every run's last committed state (partitioned like the inputs)."""
        return f"{self.app_id}-runs-changelog"
