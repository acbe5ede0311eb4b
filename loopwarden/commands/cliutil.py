"""What every command shares: its Config from flags and environment, the connection flags, one-line
connection errors, and the filter that holds aiokafka's start-up lines back."""

from __future__ import annotations

import argparse
import asyncio
import errno
import importlib.util
import logging
import os
import sys
from dataclasses import fields

from loopwarden.config import Config, env_name, from_env, listed_fields
from loopwarden.engine.exceptions import ConfigError
from loopwarden.engine.security import MECHANISMS, PROTOCOLS


class _UntilConnected(logging.Filter):
    """Holds back aiokafka's lines until the command's client has connected (``passthrough`` lets all but
    its connection errors through, for a service's log) and keeps the last connection error: a broker
    that cannot be reached at start is then said once, by the command, with aiokafka's reason."""

    connected = False
    passthrough = False
    last_error: str | None = None

    def filter(self, record: logging.LogRecord) -> bool:
        if self.connected:
            return True
        text = record.getMessage()
        if text.startswith("Unable connect to "):
            self.last_error = text.split(": ", 1)[-1]
            return False  # the command's own line says it, with this reason
        if any(name in text for name in STARTING):
            return False  # a fresh cluster electing leaders and coordinators: aiokafka retries, nothing is wrong
        return self.passthrough


# Errors aiokafka logs (some as ERROR) and retries while a cluster, or a topic just created, elects its
# leaders and group coordinator: held back until the command has connected (for the worker: recovered
# its first assignment); after that they pass, as they then say a broker moved.
STARTING = ("GroupCoordinatorNotAvailable", "NotLeaderForPartition", "LeaderNotAvailable", "NotCoordinator",
            "CoordinatorLoadInProgress", "Marking the coordinator dead")


_STARTUP = _UntilConnected()


def _connected() -> None:
    """The command's client reached the broker: aiokafka's lines pass from now on."""
    _STARTUP.connected = True


def _watch_startup(passthrough: bool) -> None:
    from loopwarden.commands.logs import NOISY

    _STARTUP.passthrough = passthrough
    for name in NOISY:
        logging.getLogger(name).addFilter(_STARTUP)


def cannot_connect(command: str, config: Config, exc: BaseException) -> str:
    """One line: where, aiokafka's reason, and which settings to check."""
    name = type(exc).__name__
    reason = _STARTUP.last_error or (str(exc) if str(exc).startswith(name) else f"{name}: {exc}")  # aiokafka's name their class
    if "SaslAuthentication" in reason or "SASL" in reason:
        hint = "check LOOPWARDEN_SASL_USERNAME, LOOPWARDEN_SASL_PASSWORD and LOOPWARDEN_SASL_MECHANISM"
    elif "CERTIFICATE_VERIFY_FAILED" in reason or "SSL" in reason:
        hint = "check LOOPWARDEN_SSL_CAFILE (the CA that signed the brokers' certificates) and LOOPWARDEN_SECURITY_PROTOCOL"
    elif "closed" in reason:
        hint = (f"the broker closed the connection: does LOOPWARDEN_SECURITY_PROTOCOL ({config.security_protocol}) "
                "match its listener?")
    else:
        hint = "is the broker up? (--broker / LOOPWARDEN_BROKER)"
    return f"loopwarden {command}: cannot connect to Kafka at {config.broker}: {reason}; {hint}"


def write_out(line: bytes, out: str) -> None:
    """A signed event (``loopwarden receipt``, ``loopwarden act``) as one JSON line: to stdout for ``-``, else
    appended to the file ``out``, to be published later or by other means."""
    if out == "-":
        sys.stdout.buffer.write(line + b"\n")
    else:
        with open(out, "ab") as f:
            f.write(line + b"\n")


def publish_signed(command: str, event, out: str | None, broker: str | None, topic: str, role: str,
                   published: str) -> None:
    """A signed event (``loopwarden receipt``, ``loopwarden act``): written to ``out`` when given (:func:`write_out`),
    else published on ``topic``, the Publisher's ``role`` topic (``steps``, ``outcomes``), at ``broker`` (default
    LOOPWARDEN_BROKER, then 127.0.0.1:9092), and then ``loopwarden COMMAND: published`` said on stderr. A broker
    that cannot be reached stops ``command`` in one line."""
    from loopwarden.codecs import encode

    if out:
        write_out(encode(event), out)
        return
    from aiokafka.errors import KafkaConnectionError

    from loopwarden.publisher import Publisher

    broker = broker or os.environ.get("LOOPWARDEN_BROKER", "127.0.0.1:9092")

    async def main() -> None:
        async with Publisher(broker, **{f"{role}_topic": topic}) as pub:
            await pub.publish(event, wait=True)

    try:
        asyncio.run(main())
    except KafkaConnectionError as exc:
        raise SystemExit(cannot_connect(command, Config(broker=broker), exc)) from None
    print(f"loopwarden {command}: {published}", file=sys.stderr)


def plural(n: int, word: str) -> str:
    """``1 partition``, ``4 partitions``: a count and its noun (a regular plural)."""
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def port_in_use(exc: BaseException) -> bool:
    """Whether ``exc`` is a listening socket's bind failing on a port another process holds."""
    return isinstance(exc, OSError) and exc.errno == errno.EADDRINUSE


def port_taken(command: str, host: str, port: int, setting: str) -> str:
    """One line: which port is taken, and the setting that moves the command to another."""
    return f"loopwarden {command}: port {port} on {host} is already in use (another process listens there): {setting}"


def _client(command: str, config: Config, coro_fn):
    """Run a Kafka client command: a broker that cannot be reached or refuses the credentials is one line
    saying why (exit 1). (Its logging is set by ``loopwarden.cli.set_up_process``.)"""
    from aiokafka.errors import KafkaConnectionError

    from loopwarden.engine.exceptions import TopicLayoutError, UntrustedChannelError
    try:
        return asyncio.run(coro_fn())
    except KafkaConnectionError as exc:
        raise SystemExit(cannot_connect(command, config, exc)) from None
    except (TopicLayoutError, UntrustedChannelError) as exc:
        raise SystemExit(f"loopwarden {command}: {exc}") from None


def _config(args: argparse.Namespace) -> Config:
    # A flag is the Config field of the same name (dest); a command without it leaves the env's value.
    overrides = {f.name: getattr(args, f.name, None) for f in fields(Config)}
    try:
        return from_env(overrides)
    except ConfigError as exc:
        raise SystemExit(f"loopwarden: {_named(str(exc), overrides)}") from None


def _named(message: str, overrides: dict) -> str:
    """A Config error names the field (``log_level: 'loud' ...``); a value that came from the environment is
    named by its variable instead, the place the user has to change."""
    import os

    name, sep, rest = message.partition(": ")
    if sep and name in overrides and overrides[name] is None and os.environ.get(env_name(name)) is not None:
        return f"{env_name(name)}: {rest}"
    return message


def _common(p: argparse.ArgumentParser, *, topics: tuple[str, ...] = ("steps", "outcomes", "health", "deadletter", "ticks"),
            partitions: bool = True) -> None:
    """The connection flags, and the topic flags of the topics the command uses (no others: a flag a
    command would ignore is refused)."""
    p.add_argument("--broker", help="Kafka bootstrap host:port[,host:port] (env LOOPWARDEN_BROKER; default 127.0.0.1:9092)")
    defaults = {"steps": "agent.steps", "outcomes": "agent.outcomes", "health": "agent.health",
                "deadletter": "agent.deadletter", "ticks": "loopwarden.ticks", "actions": "agent.actions"}
    for t in topics:
        p.add_argument(f"--{t}-topic", dest=f"{t}_topic", help=f"default {defaults[t]} (LOOPWARDEN_{t.upper()}_TOPIC)")
    if partitions:
        p.add_argument("--partitions", type=int, help="partitions of the topics it creates (LOOPWARDEN_PARTITIONS; default 8)")
    g = p.add_argument_group("TLS and SASL (every connection; the password only as LOOPWARDEN_SASL_PASSWORD)")
    g.add_argument("--security-protocol", dest="security_protocol", choices=PROTOCOLS,
                   help="LOOPWARDEN_SECURITY_PROTOCOL; default PLAINTEXT")
    g.add_argument("--sasl-mechanism", dest="sasl_mechanism", choices=MECHANISMS, help="LOOPWARDEN_SASL_MECHANISM")
    g.add_argument("--sasl-username", dest="sasl_username", help="LOOPWARDEN_SASL_USERNAME")
    g.add_argument("--ssl-cafile", dest="ssl_cafile", help="CA bundle (PEM) to verify the brokers; default the system's (LOOPWARDEN_SSL_CAFILE)")
    g.add_argument("--ssl-certfile", dest="ssl_certfile", help="client certificate (PEM) for mutual TLS (LOOPWARDEN_SSL_CERTFILE)")
    g.add_argument("--ssl-keyfile", dest="ssl_keyfile", help="its private key (PEM) (LOOPWARDEN_SSL_KEYFILE)")
    g.add_argument("--no-ssl-check-hostname", dest="ssl_check_hostname", action="store_const", const=False, default=None,
                   help="do not check the broker's certificate names its host (LOOPWARDEN_SSL_CHECK_HOSTNAME=false)")


def _env_epilog() -> str:
    """Every setting's environment variable and default (the flags above override them)."""
    lines = ["environment (a flag overrides its variable):"]
    for f in listed_fields():
        default = getattr(Config(), f.name)
        shown = "unset" if default is None else default
        lines.append(f"  LOOPWARDEN_{f.name.upper():<22} default {shown}")
    return "\n".join(lines)


def _states_epilog() -> str:
    """The health states, what to do about each, and where docs/states.md explains it."""
    from loopwarden.docs_links import STATE_GUIDE, state_action, state_doc

    lines = ["health states (--state), what to do, and where it is explained:"]
    for state in STATE_GUIDE:
        lines.append(f"  {state:<18} {state_action(state):<36} {state_doc(state)}")
    return "\n".join(lines)


def needs_extra(what: str, module: str, extra: str = "processor") -> None:
    """Stop in one line naming the extra to install when ``module`` (a dependency of ``what``) is missing:
    the base install (msgspec only) replays and prints the schema; the rest comes with an extra."""
    if importlib.util.find_spec(module) is None:
        raise SystemExit(f"loopwarden {what} needs the '{extra}' extra ({module}): pip install 'loopwarden[{extra}]'")


def trusted_verifiers(text: str | None):
    """The trusted verifiers of a ``--trusted-verifiers`` flag, else of LOOPWARDEN_TRUSTED_VERIFIERS; None when neither."""
    env = "LOOPWARDEN_TRUSTED_VERIFIERS"  # loopwarden.trust.ENV, named here so that replay without it needs no cryptography
    if text is None and not os.environ.get(env):
        return None
    needs_extra("--trusted-verifiers" if text is not None else env, "cryptography")
    from loopwarden.trust import TrustConfigError, TrustedVerifiers

    try:
        if text is not None:
            return TrustedVerifiers.parse(text, "--trusted-verifiers")
        return TrustedVerifiers.from_env(os.environ)
    except TrustConfigError as exc:
        raise SystemExit(f"loopwarden: {exc}") from None


def recovery_policies(path: str | None, command: str) -> dict:
    """The agents' default recovery policies of the file ``path`` names, else LOOPWARDEN_RECOVERY_POLICIES's (empty
    when neither): a bad file stops ``command`` in one line naming the file, the agent and the field."""
    from loopwarden.stages.health.recoverypolicies import ENV, RecoveryPoliciesError, load_policies

    path = path or os.environ.get(ENV, "").strip()
    try:
        return load_policies(path) if path else {}
    except RecoveryPoliciesError as exc:
        raise SystemExit(f"loopwarden {command}: {exc}") from None
