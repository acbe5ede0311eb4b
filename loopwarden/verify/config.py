"""The verifier's configuration: a TOML file (``loopwarden verify --config FILE``), validated up front.

Everything a check may touch is named here — allow-lists of file prefixes, HTTPS hosts and
PostgreSQL databases, the credentials for them (from environment variables the file names), named
JSON Schemas, webhook secrets — never in events. An expectation whose target is outside these is
refused, counted and logged, and nothing is fetched.
"""

from __future__ import annotations

import os
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

_TOPIC = re.compile(r"^[A-Za-z0-9._-]{1,249}$")
_HOST = re.compile(r"^[A-Za-z0-9.-]{1,253}(:\d{1,5})?$")
_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}(\.[A-Za-z_][A-Za-z0-9_]{0,62})?$")


class VerifyConfigError(ValueError):
    """A verifier setting that cannot be used; the message names it and its value."""


# How the verifier talks to a database (libpq's words): verify-full checks the server's certificate
# and that it names the host; verify-ca only the certificate; disable is plaintext, only when written.
# libpq's require/prefer/allow are refused: TLS without a verified server lets anyone on the path answer.
SSLMODES = ("verify-full", "verify-ca", "disable")
_DATABASE_KEYS = ("host", "port", "dbname", "user", "password_env", "tables", "sslmode", "sslrootcert")


@dataclass(frozen=True)
class Database:
    """One PostgreSQL database checks may read; targets name it by host, port and dbname."""

    host: str
    port: int
    dbname: str
    user: str
    password_env: str | None = None
    tables: tuple[str, ...] = ()  # required (the config refuses an entry without): the only tables checks read
    sslmode: str = "verify-full"
    sslrootcert: str | None = None  # CA bundle the server's certificate must chain to; default: the system's

    @property
    def password(self) -> str | None:
        return None if self.password_env is None else os.environ.get(self.password_env)


@dataclass(frozen=True)
class VerifyConfig:
    broker: str = "127.0.0.1:9092"
    steps_topic: str = "agent.steps"
    outcomes_topic: str = "agent.outcomes"
    # When set (LOOPWARDEN_TRUSTED_OUTCOMES_TOPIC, as the worker's), receipts go to this topic, which only the
    # verifiers may write (Kafka ACLs): the worker trusts them by channel. Still signed (end-to-end evidence).
    trusted_outcomes_topic: str | None = None
    group_id: str = "loopwarden-verify"
    signing_key: str | None = None  # path of the key file `loopwarden keys new` wrote
    check_timeout_s: float = 10.0
    max_concurrency: int = 32
    max_body_bytes: int = 16 * 1024 * 1024
    # A destination that answered "absent or wrong" is asked again for this long (it may still be
    # arriving), within the run's receipt window, before the negative receipt is published.
    retry_negative_s: float = 30.0
    retry_initial_s: float = 0.5
    retry_max_s: float = 10.0
    # On start, expectations and run ends are read back this far (receipt ids make repeats harmless).
    lookback_s: float = 3600.0
    default_receipt_window_s: float = 600.0
    web_host: str = "127.0.0.1"
    web_port: int = 6068  # the board has 6067, the worker 6066: the three run side by side
    file_prefixes: tuple[str, ...] = ()
    http_hosts: tuple[str, ...] = ()  # host or host:port (443 when no port)
    http_cafile: str | None = None  # CA bundle for TLS verification; default: the system's
    http_headers: dict[str, dict[str, str]] = field(default_factory=dict)  # host -> header -> env var name
    databases: tuple[Database, ...] = ()
    json_schemas: dict[str, str] = field(default_factory=dict)  # name -> path of a JSON Schema file
    webhook_secrets: dict[str, str] = field(default_factory=dict)  # provider -> env var holding the secret

    def __post_init__(self) -> None:
        for name in ("steps_topic", "outcomes_topic", "trusted_outcomes_topic"):
            if name == "trusted_outcomes_topic" and self.trusted_outcomes_topic is None:
                continue
            if not isinstance(getattr(self, name), str) or not _TOPIC.match(getattr(self, name)):
                raise VerifyConfigError(f"{name}: {getattr(self, name)!r} is not a valid Kafka topic name")
        for name, lo, hi in (("check_timeout_s", 0.01, 3600), ("retry_negative_s", 0, 86400), ("retry_initial_s", 0.01, 3600),
                             ("retry_max_s", 0.01, 3600), ("lookback_s", 0, 30 * 86400),
                             ("default_receipt_window_s", 1, 366 * 86400)):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not lo <= value <= hi:
                raise VerifyConfigError(f"{name}: {value!r} must be a number between {lo} and {hi}")
        if not isinstance(self.max_concurrency, int) or not 1 <= self.max_concurrency <= 10_000:
            raise VerifyConfigError(f"max_concurrency: {self.max_concurrency!r} must be an integer between 1 and 10000")
        if not isinstance(self.max_body_bytes, int) or not 1024 <= self.max_body_bytes <= 2**34:
            raise VerifyConfigError(f"max_body_bytes: {self.max_body_bytes!r} must be an integer between 1024 and 2**34")
        for prefix in self.file_prefixes:
            if not isinstance(prefix, str) or not os.path.isabs(prefix):
                raise VerifyConfigError(f"file.prefixes: {prefix!r} must be an absolute directory path")
        for host in self.http_hosts:
            if not isinstance(host, str) or not _HOST.match(host):
                raise VerifyConfigError(f"http.hosts: {host!r} must be host or host:port")
        for host, headers in self.http_headers.items():
            if host not in self.http_hosts:
                raise VerifyConfigError(f"http.headers: host {host!r} is not in http.hosts")
            for name, env in headers.items():
                if not isinstance(env, str) or not env:
                    raise VerifyConfigError(f"http.headers.{host}.{name}: {env!r} must name an environment variable")
        for i, db in enumerate(self.databases):
            where = f"postgresql.databases[{i}] ({db.host}:{db.port}/{db.dbname})"
            if not db.tables:
                raise VerifyConfigError(f"{where}: tables is required: list the tables checks may read "
                                        "(e.g. tables = [\"public.invoices\"])")
            for t in db.tables:
                if not isinstance(t, str) or not _IDENT.match(t):
                    raise VerifyConfigError(f"{where}: table {t!r} is not an identifier (schema.table)")
            if db.sslmode not in SSLMODES:
                raise VerifyConfigError(f"{where}: sslmode {db.sslmode!r} must be one of {', '.join(SSLMODES)} "
                                        "(plaintext only with sslmode = \"disable\")")
            if db.sslrootcert is not None and not Path(db.sslrootcert).is_file():
                raise VerifyConfigError(f"{where}: sslrootcert {db.sslrootcert!r} is not a readable file")
        for name, path in self.json_schemas.items():
            if not Path(path).is_file():
                raise VerifyConfigError(f"json_schemas.{name}: {path!r} is not a readable file")

    @property
    def receipts_topic(self) -> str:
        """Where receipts are published: the trusted topic when set, else the outcomes topic."""
        return self.trusted_outcomes_topic or self.outcomes_topic

    @property
    def real_prefixes(self) -> tuple[str, ...]:
        """The file prefixes with symlinks resolved, each ending in a separator."""
        return tuple(os.path.join(os.path.realpath(p), "") for p in self.file_prefixes)

    def database(self, host: str, port: int, dbname: str) -> Database | None:
        for db in self.databases:
            if (db.host, db.port, db.dbname) == (host, port, dbname):
                return db
        return None


def _section(doc: dict, name: str) -> dict:
    value = doc.get(name, {})
    if not isinstance(value, dict):
        raise VerifyConfigError(f"[{name}] must be a table, got {value!r}")
    return value


def load(path: str | os.PathLike | None = None, overrides: dict[str, Any] | None = None) -> VerifyConfig:
    """Read a verifier config file (TOML); ``overrides`` (flags) win over the file."""
    doc: dict = {}
    if path is not None:
        try:
            doc = tomllib.loads(Path(path).read_text())
        except OSError as exc:
            raise VerifyConfigError(f"config {str(path)!r}: cannot read: {exc.strerror}") from None
        except tomllib.TOMLDecodeError as exc:
            raise VerifyConfigError(f"config {str(path)!r}: not valid TOML: {exc}") from None
    values: dict[str, Any] = {}
    simple = {f for f in VerifyConfig.__dataclass_fields__} - {
        "file_prefixes", "http_hosts", "http_cafile", "http_headers", "databases", "json_schemas", "webhook_secrets"}
    for key, value in doc.items():
        if key in simple:
            values[key] = value
        elif key not in ("file", "http", "postgresql", "json_schemas", "webhooks"):
            raise VerifyConfigError(f"config: unknown setting {key!r}")
    f, h, pg = _section(doc, "file"), _section(doc, "http"), _section(doc, "postgresql")
    values["file_prefixes"] = tuple(f.get("prefixes", ()))
    values["http_hosts"] = tuple(h.get("hosts", ()))
    values["http_cafile"] = h.get("cafile")
    values["http_headers"] = dict(h.get("headers", {}))
    dbs = []
    for i, d in enumerate(pg.get("databases", ())):
        unknown = sorted(set(d) - set(_DATABASE_KEYS)) if isinstance(d, dict) else []
        if unknown:
            raise VerifyConfigError(f"postgresql.databases[{i}]: unknown setting {unknown[0]!r}")
        try:
            dbs.append(Database(host=str(d["host"]), port=int(d.get("port", 5432)), dbname=str(d["dbname"]),
                                user=str(d["user"]), password_env=d.get("password_env"), tables=tuple(d.get("tables", ())),
                                sslmode=str(d.get("sslmode", "verify-full")), sslrootcert=d.get("sslrootcert")))
        except (KeyError, TypeError, ValueError) as exc:
            raise VerifyConfigError(f"postgresql.databases[{i}]: {d!r} needs host, dbname, user, tables (and port, "
                                    f"password_env, sslmode, sslrootcert): {exc!r}") from None
    values["databases"] = tuple(dbs)
    values["json_schemas"] = dict(_section(doc, "json_schemas"))
    values["webhook_secrets"] = {name: str(w.get("secret_env", "")) for name, w in _section(doc, "webhooks").items()}
    env_topic = os.environ.get("LOOPWARDEN_TRUSTED_OUTCOMES_TOPIC")
    if env_topic:  # the worker's setting: one variable for both sides
        values["trusted_outcomes_topic"] = env_topic
    for key, value in (overrides or {}).items():
        if value is not None:
            values[key] = value
    try:
        return VerifyConfig(**values)
    except TypeError as exc:
        raise VerifyConfigError(f"config: {exc}") from None
