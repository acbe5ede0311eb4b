"""Processor configuration: flags over environment variables over defaults, validated up front."""

from __future__ import annotations

import os
import re
import socket
from dataclasses import dataclass, field, fields

from loopwarden.engine.exceptions import ConfigError

_TOPIC = re.compile(r"^[A-Za-z0-9._-]{1,249}$")
_BROKER = re.compile(r"^[A-Za-z0-9.\-\[\]:]+:\d{1,5}$")
_HOST = re.compile(r"^[A-Za-z0-9.\-:\[\]%]{1,255}$")
STORES = ("memory", "rocksdb")
CLOCKS = ("wall", "event")
LOG_LEVELS = ("debug", "info", "warning", "error")


# Settings that must lie in a range (bounds included): name -> (lowest, highest).
_RANGES = {
    "partitions": (1, 10_000), "otel_partitions": (1, 10_000), "replication": (1, 100), "web_port": (0, 65535),
    "otel_end_grace_s": (0, 600),
    "http_header_timeout_s": (0.1, 3600), "http_max_header_bytes": (1024, 1_048_576),
    "http_max_connections": (1, 100_000), "board_port": (0, 65535), "board_max_runs": (100, 10_000_000),
    "tick_interval_s": (0.05, 3600), "shutdown_timeout_s": (1, 3600), "batch_max_records": (1, 1_000_000),
    "commit_gap_ms": (0, 1000), "commit_offsets_ms": (0, 60_000), "align_max_ms": (0, 60_000),
    "batch_wait_ms": (0, 10_000), "input_buffer_max_bytes": (1_048_576, 1 << 40), "expand_window_s": (0, 86400),
    "expand_settle_ms": (0, 60_000), "topology_check_s": (1, 3600), "stall_timeout_s": (1, 86400),
    "max_message_bytes": (10_000, 100_000_000), "session_timeout_s": (1, 300),
}


@dataclass(frozen=True)
class Config:
    """Every knob of the processor. Each has an env var ``LOOPWARDEN_<NAME>``."""

    # Kafka bootstrap servers, `host:port[,host:port]` (the protocol is `security_protocol`).
    broker: str = "127.0.0.1:9092"
    # Consumer group, transactional id prefix and changelog topic prefix.
    app_id: str = "loopwarden"
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
    # Partitions of the topics created; must equal the existing inputs' count (`loopwarden topics check`).
    partitions: int = 8
    # Replication factor of the topics created (3 on a cluster).
    replication: int = 1
    # State store: `memory`, or `rocksdb` (local state survives restarts; only the changelog's tail is read).
    store: str = "memory"
    # RocksDB directory (created if missing; its parent must exist, checked before connecting).
    data_dir: str = ".loopwarden-data"
    # HTTP bind address (localhost unless set).
    web_host: str = "127.0.0.1"
    # HTTP port of /metrics, /healthz, /readyz and /runs.
    web_port: int = 6066
    # The URL peers use to reach this worker (GET /runs/{id} is forwarded to the
    # owner); default http://<web_host>:<web_port>, with the host name for 0.0.0.0.
    canonical_url: str | None = None
    # When set (16+ characters), every route but /healthz needs `Authorization: Bearer <token>`.
    token: str | None = field(default=None, repr=False)
    # HTTP limits (loopwarden.api.httplimits): a client's request headers must be complete within
    # this long (s)...
    http_header_timeout_s: float = 10.0
    # ...and this size (bytes), or the connection is answered 408/431 and closed.
    http_max_header_bytes: int = 32768
    # Connections beyond this are answered 503 and closed.
    http_max_connections: int = 512
    # The runs board (`loopwarden board`, loopwarden.api.board): the port it listens on.
    board_port: int = 6067
    # How far back the board reads agent.health when it starts.
    board_lookback_s: float = 86400.0
    # How long a settled run (VERIFIED_COMPLETE, BOUNDED_STOP) stays on the board.
    board_settled_s: float = 3600.0
    # Runs the board holds at most (the longest-settled go first, then the quiet longest).
    board_max_runs: int = 100_000
    # Where each state's doc lives (the board and /runs link `<this>#<state>`).
    states_doc_url: str = "docs/states.md"
    # The worker also serves the board at /board/ (its own reader of agent.health, every partition).
    board_in_worker: bool = False
    # The OpenTelemetry bridge (`loopwarden bridge`, `worker --otel`): the topic the Collector's Kafka
    # exporter writes (otlp_proto or otlp_json, one trace per message, keyed by trace id).
    otel_topic: str = "otlp_spans"
    # Partitions of the otel topic and of the bridge's changelog (created with this many when missing).
    otel_partitions: int = 8
    # How long the bridge holds a run that ended in error, cancelled, after a tool request or without a
    # recorded finish reason, for its spans that end after its run span (a cancelled tool's); a run that
    # ended cleanly is published at once.
    otel_end_grace_s: float = 2.0
    # Timers on processing time (`wall`) or on the event-time clock (`event`: steps' and receipts' ts, and explicit ticks).
    clock: str = "wall"
    # How often each partition's due timers fire.
    tick_interval_s: float = 1.0
    # A worker told to stop exits by then even if its broker is gone.
    shutdown_timeout_s: float = 30.0
    # A batch is at most this many records (all partitions) and waits at most this long for them.
    batch_max_records: int = 20000
    # How long a batch waits for records at most (it returns at once when records are there).
    batch_wait_ms: int = 5
    # Bytes of input records (their values) a worker keeps before folding them, over all its partitions:
    # fetched and not folded yet, or held for stream-time alignment. At this bound the loop takes nothing
    # more from the consumer until its pipelines have folded what waits; held records filling it alone
    # pause the input they came from until the other caught up. In memory a record takes ~4x (290 B events).
    input_buffer_max_bytes: int = 64 * 1_048_576
    # A partition's next transaction starts at least this long after its last commit: the broker
    # writes the commit markers meanwhile (one begun sooner meets CONCURRENT_TRANSACTIONS and
    # the client retries only after a fixed 20 ms).
    commit_gap_ms: int = 6
    # Every transaction writes the input offsets it consumed up to in the changelog (a restart resumes
    # there); the group's committed offsets follow, committed by the worker's consumer after the
    # transactions (one request for all its partitions, in no transaction) at most this often, and when
    # a partition is given up (stop, rebalance): lag tools see them this late at most. 0: the group's
    # offsets go inside every transaction (AddOffsetsToTxn + TxnOffsetCommit, two more broker round trips
    # each), for workers older than the changelog's record sharing the group (docs/operations.md).
    commit_offsets_ms: int = 1000
    # Records of one input stamped later than all the other input has shown, while that one holds
    # more on the broker than has been consumed, wait for it (so steps and receipts meet in event
    # time across batches) while that input sends a backlog, and this long after it last did; past 20,000
    # held the input they came from is paused meanwhile; 0: no waiting.
    align_max_ms: int = 1000
    # How often the worker reads the topic layout again (and at every rebalance): a co-partitioned topic
    # grown alone, or an output deleted or re-created, stops processing until the layout is right again.
    topology_check_s: float = 10.0
    # After `loopwarden topics expand`, for this long (s), a moved run's records sent straight to its new
    # partition wait there until its old partition has forwarded the records producers still hashing over
    # the old count sent it (so they are applied in the order produced); longer than metadata.max.age.ms.
    expand_window_s: float = 600.0
    # The clock skew and time in flight allowed between a producer's records to the old and the new partition (ms).
    expand_settle_ms: int = 1000
    # A partition with lag whose committed offset has not moved for this long is stalled (/readyz 503).
    stall_timeout_s: float = 60.0
    # Largest message produced (dead letters are truncated to fit); at most the broker's limit.
    max_message_bytes: int = 1_000_000
    # The group's session timeout: how soon a dead or paused worker's partitions move.
    session_timeout_s: float = 6.0
    # Settled runs and orphan receipts are dropped after this long without events.
    retention_s: float = 7 * 86400
    # An event or tick stamped more than this ahead of the worker's wall clock is dead-lettered.
    max_future_skew_s: float = 300.0
    # A dropped run's last seq is kept this long (a tomb of ~70 B), so its run id's seq never repeats.
    seq_memory_s: float = 30 * 86400
    # Every this many seconds the worker hands the C heap's free pages back to the OS (glibc's
    # malloc_trim; see loopwarden.engine.memory); 0: never.
    malloc_trim_s: float = 30.0
    # The worker's log level: debug, info, warning, error.
    log_level: str = "info"
    # How every client connects (loopwarden.engine.security): PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL.
    security_protocol: str = "PLAINTEXT"
    sasl_mechanism: str | None = None  # PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512 (required with SASL_*)
    # SASL user.
    sasl_username: str | None = None
    # SASL password (environment only: a flag would show in `ps`).
    sasl_password: str | None = field(default=None, repr=False)
    ssl_cafile: str | None = None  # PEM CA bundle; default: the system's CAs
    ssl_certfile: str | None = None  # client certificate (PEM), for mutual TLS
    ssl_keyfile: str | None = None  # its private key, if not in the certificate file
    # Check that the broker's certificate names the host connected to.
    ssl_check_hostname: bool = True

    def __post_init__(self) -> None:
        for name in ("steps_topic", "outcomes_topic", "health_topic", "deadletter_topic", "actions_topic", "ticks_topic",
                     "otel_topic"):
            value = getattr(self, name)
            if not _TOPIC.match(value):
                raise ConfigError(f"{name}: {value!r} is not a valid Kafka topic name ([A-Za-z0-9._-], 1-249 chars)")
        if self.trusted_outcomes_topic is not None and not _TOPIC.match(self.trusted_outcomes_topic):
            raise ConfigError(f"trusted_outcomes_topic: {self.trusted_outcomes_topic!r} is not a valid Kafka topic "
                              "name ([A-Za-z0-9._-], 1-249 chars)")
        names = [self.steps_topic, self.outcomes_topic, self.health_topic, self.deadletter_topic, self.actions_topic,
                 self.ticks_topic, self.otel_topic, *([self.trusted_outcomes_topic] if self.trusted_outcomes_topic else [])]
        if len(set(names)) != len(names):
            raise ConfigError(f"topic names must differ, got {names}")
        for part in self.broker.split(","):
            if not _BROKER.match(part.strip()):
                hint = (" (the protocol is a setting of its own: LOOPWARDEN_SECURITY_PROTOCOL / --security-protocol)"
                        if "://" in part else "")
                raise ConfigError(f"broker: {self.broker!r} is not host:port[,host:port...]{hint}")
        if not re.match(r"^[A-Za-z0-9._-]{1,100}$", self.app_id):
            raise ConfigError(f"app_id: {self.app_id!r} must be 1-100 chars of [A-Za-z0-9._-]")
        for name, (low, high) in _RANGES.items():
            value = getattr(self, name)
            if not low <= value <= high:
                raise ConfigError(f"{name}: {value} must be between {low} and {high}")
        if self.store not in STORES:
            raise ConfigError(f"store: {self.store!r} must be one of {', '.join(STORES)}")
        if self.clock not in CLOCKS:
            raise ConfigError(f"clock: {self.clock!r} must be one of {', '.join(CLOCKS)}")
        if not _HOST.match(self.web_host):
            raise ConfigError(f"web_host: {self.web_host!r} is not a host name or IP address")
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
        if self.malloc_trim_s != 0 and not 1 <= self.malloc_trim_s <= 86400:
            raise ConfigError(f"malloc_trim_s: {self.malloc_trim_s} must be 0 (never) or between 1 and 86400")
        if self.canonical_url is not None and not re.match(r"^https?://[^/\s]+$", self.canonical_url):
            raise ConfigError(f"canonical_url: {self.canonical_url!r} must be http(s)://host:port with no path")
        if self.log_level.lower() not in LOG_LEVELS:
            raise ConfigError(f"log_level: {self.log_level!r} must be one of {', '.join(LOG_LEVELS)}")
        if self.token is not None and len(self.token) < 16:
            raise ConfigError("token: must be at least 16 characters (got a shorter one)")
        if self.recovery_policies:  # read once here too, so a bad file stops the start in one line
            from loopwarden.stages.health.recoverypolicies import RecoveryPoliciesError, load_policies

            try:
                load_policies(self.recovery_policies)
            except RecoveryPoliciesError as exc:
                raise ConfigError(f"recovery_policies: {exc}") from None
        from loopwarden.engine import security

        security.check(self)

    @property
    def advertised_url(self) -> str:
        """canonical_url, else http://<web_host>:<web_port> (the host name when bound to all interfaces)."""
        if self.canonical_url:
            return self.canonical_url
        host = socket.gethostname() if self.web_host in ("0.0.0.0", "::") else self.web_host
        return f"http://{host}:{self.web_port}"

    @property
    def changelog_topic(self) -> str:
        """The compacted topic that holds every run's last committed state (partitioned like the inputs)."""
        return f"{self.app_id}-runs-changelog"

    @property
    def bootstrap(self) -> str:
        return self.broker


def _shown_default(f) -> str:
    value = getattr(Config(), f.name)
    return "none" if value is None else str(value)


def env_name(name: str) -> str:
    return "LOOPWARDEN_" + name.upper()


def from_env(overrides: dict | None = None, environ: dict | None = None) -> Config:
    """Build a Config from ``LOOPWARDEN_*`` variables, then ``overrides`` (flags; None = unset)."""
    environ = os.environ if environ is None else environ
    values: dict = {}
    for f in fields(Config):
        raw = environ.get(env_name(f.name))
        if raw is None:
            continue
        if raw.strip() == "":  # `LOOPWARDEN_BROKER=` must not silently mean the default
            raise ConfigError(f"{env_name(f.name)} is set but empty: give it a value, or unset it for the default "
                              f"({_shown_default(f)})")
        kind = f.type if isinstance(f.type, str) else f.type.__name__
        try:
            if kind == "bool":
                if raw.lower() not in ("true", "false", "1", "0", "yes", "no"):
                    raise ValueError(raw)
                values[f.name] = raw.lower() in ("true", "1", "yes")
            elif kind.startswith("int"):
                values[f.name] = int(raw)
            elif kind.startswith("float"):
                values[f.name] = float(raw)
            else:
                values[f.name] = raw
        except ValueError:
            raise ConfigError(f"{env_name(f.name)}: {raw!r} is not a valid {kind.split(' ')[0]}") from None
    for key, value in (overrides or {}).items():
        if value is not None:
            values[key] = value
    return Config(**values)
