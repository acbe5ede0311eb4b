"""The engine's configuration: flags over environment variables over defaults, validated up front.

:class:`EngineConfig` holds what the engine reads (the broker and how to reach it, the group, the store, the
loop's batch and commit tuning, the process's HTTP address); each stage's config extends it with its own
settings in the stage's folder (``loopwarden.stages.<stage>.config``), and a process's config is the stages' it
runs (``loopwarden.config.Config``). Every setting is an environment variable ``LOOPWARDEN_<NAME>``.
"""

from __future__ import annotations

import os
import re
import socket
from dataclasses import MISSING, dataclass, field, fields
from typing import TypeVar

from loopwarden.engine.exceptions import ConfigError

TOPIC = re.compile(r"^[A-Za-z0-9._-]{1,249}$")
_BROKER = re.compile(r"^[A-Za-z0-9.\-\[\]:]+:\d{1,5}$")
_HOST = re.compile(r"^[A-Za-z0-9.\-:\[\]%]{1,255}$")
STORES = ("memory", "rocksdb")
LOG_LEVELS = ("debug", "info", "warning", "error")


# Settings that must lie in a range (bounds included): name -> (lowest, highest).
_RANGES = {
    "partitions": (1, 10_000), "replication": (1, 100), "web_port": (0, 65535),
    "http_header_timeout_s": (0.1, 3600), "http_max_header_bytes": (1024, 1_048_576),
    "http_max_connections": (1, 100_000),
    "tick_interval_s": (0.05, 3600), "shutdown_timeout_s": (1, 3600), "batch_max_records": (1, 1_000_000),
    "commit_gap_ms": (0, 1000), "commit_offsets_ms": (0, 60_000), "align_max_ms": (0, 60_000),
    "batch_wait_ms": (0, 10_000), "input_buffer_max_bytes": (1_048_576, 1 << 40),
    "topology_check_s": (1, 3600), "stall_timeout_s": (1, 86400),
    "max_message_bytes": (10_000, 100_000_000), "session_timeout_s": (1, 300),
}


def check_ranges(config: object, ranges: dict[str, tuple[float, float]]) -> None:
    """Raise a ConfigError naming the first setting of ``ranges`` (name -> (lowest, highest)) out of its range."""
    for name, (low, high) in ranges.items():
        value = getattr(config, name)
        if not low <= value <= high:
            raise ConfigError(f"{name}: {value} must be between {low} and {high}")


@dataclass(frozen=True)
class EngineConfig:
    """The engine's knobs. Each has an env var ``LOOPWARDEN_<NAME>``."""


    # Kafka bootstrap servers, `host:port[,host:port]` (the protocol is `security_protocol`).
    broker: str = "127.0.0.1:9092"
    # Consumer group, transactional id prefix and changelog topic prefix.
    app_id: str = "loopwarden"
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
    # A partition with lag whose committed offset has not moved for this long is stalled (/readyz 503).
    stall_timeout_s: float = 60.0
    # Largest message produced (dead letters are truncated to fit); at most the broker's limit.
    max_message_bytes: int = 1_000_000
    # The group's session timeout: how soon a dead or paused worker's partitions move.
    session_timeout_s: float = 6.0
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

    def topics(self) -> dict[str, str]:
        """Setting -> topic name, of every topic the settings name (a stage's config adds its own): each must be
        a valid topic name, and no two the same."""
        return {}

    def __post_init__(self) -> None:
        named = self.topics()
        for name, value in named.items():
            if not TOPIC.match(value):
                raise ConfigError(f"{name}: {value!r} is not a valid Kafka topic name ([A-Za-z0-9._-], 1-249 chars)")
        names = list(named.values())
        if len(set(names)) != len(names):
            raise ConfigError(f"topic names must differ, got {names}")
        for part in self.broker.split(","):
            if not _BROKER.match(part.strip()):
                hint = (" (the protocol is a setting of its own: LOOPWARDEN_SECURITY_PROTOCOL / --security-protocol)"
                        if "://" in part else "")
                raise ConfigError(f"broker: {self.broker!r} is not host:port[,host:port...]{hint}")
        if not re.match(r"^[A-Za-z0-9._-]{1,100}$", self.app_id):
            raise ConfigError(f"app_id: {self.app_id!r} must be 1-100 chars of [A-Za-z0-9._-]")
        check_ranges(self, _RANGES)
        if self.store not in STORES:
            raise ConfigError(f"store: {self.store!r} must be one of {', '.join(STORES)}")
        if not _HOST.match(self.web_host):
            raise ConfigError(f"web_host: {self.web_host!r} is not a host name or IP address")
        if self.malloc_trim_s != 0 and not 1 <= self.malloc_trim_s <= 86400:
            raise ConfigError(f"malloc_trim_s: {self.malloc_trim_s} must be 0 (never) or between 1 and 86400")
        if self.canonical_url is not None and not re.match(r"^https?://[^/\s]+$", self.canonical_url):
            raise ConfigError(f"canonical_url: {self.canonical_url!r} must be http(s)://host:port with no path")
        if self.log_level.lower() not in LOG_LEVELS:
            raise ConfigError(f"log_level: {self.log_level!r} must be one of {', '.join(LOG_LEVELS)}")
        if self.token is not None and len(self.token) < 16:
            raise ConfigError("token: must be at least 16 characters (got a shorter one)")
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
    def bootstrap(self) -> str:
        return self.broker


ConfigT = TypeVar("ConfigT", bound=EngineConfig)


def _shown_default(f) -> str:
    value = f.default if f.default is not MISSING else f.default_factory()
    return "none" if value is None else str(value)


def env_name(name: str) -> str:
    return "LOOPWARDEN_" + name.upper()


def from_env(overrides: dict | None = None, environ: dict | None = None, *,
             kind: type[ConfigT] = EngineConfig) -> ConfigT:  # type: ignore[assignment]
    """Build a ``kind`` (EngineConfig, a stage's config or a process's) from ``LOOPWARDEN_*`` variables, then
    ``overrides`` (flags; None = unset)."""
    environ = os.environ if environ is None else environ
    values: dict = {}
    for f in fields(kind):
        raw = environ.get(env_name(f.name))
        if raw is None:
            continue
        if raw.strip() == "":  # `LOOPWARDEN_BROKER=` must not silently mean the default
            raise ConfigError(f"{env_name(f.name)} is set but empty: give it a value, or unset it for the default "
                              f"({_shown_default(f)})")
        ftype = f.type if isinstance(f.type, str) else f.type.__name__
        try:
            if ftype == "bool":
                if raw.lower() not in ("true", "false", "1", "0", "yes", "no"):
                    raise ValueError(raw)
                values[f.name] = raw.lower() in ("true", "1", "yes")
            elif ftype.startswith("int"):
                values[f.name] = int(raw)
            elif ftype.startswith("float"):
                values[f.name] = float(raw)
            else:
                values[f.name] = raw
        except ValueError:
            raise ConfigError(f"{env_name(f.name)}: {raw!r} is not a valid {ftype.split(' ')[0]}") from None
    for key, value in (overrides or {}).items():
        if value is not None:
            values[key] = value
    return kind(**values)
