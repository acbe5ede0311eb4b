"""``loopwarden actions``: deliver recovery actions to a fleet's controller over an HTTPS webhook (docs/actions.md)."""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import ssl
import sys
from urllib.parse import urlsplit

from loopwarden.commands.cliutil import _common

HELP = "deliver each recovery action on agent.actions to the fleet's controller (HTTPS webhook, HMAC-signed)"


def add_command(sub) -> None:
    p = sub.add_parser("actions", help=HELP)
    _common(p, topics=(), partitions=False)
    p.add_argument("--webhook", metavar="URL",
                   help="the controller's https:// URL each action is POSTed to (LOOPWARDEN_ACTIONS_WEBHOOK)")
    p.add_argument("--secret-file", dest="secret_file", metavar="FILE",
                   help="the shared secret the body is signed with, HMAC-SHA256 in X-Loopwarden-Signature "
                        "(LOOPWARDEN_ACTIONS_SECRET_FILE; none: deliveries are unsigned)")
    p.add_argument("--ca-file", dest="ca_file", metavar="FILE",
                   help="CA bundle (PEM) to verify the webhook's certificate; default the system's "
                        "(LOOPWARDEN_ACTIONS_CA_FILE)")
    p.add_argument("--actions-topic", dest="actions_topic", metavar="TOPIC",
                   help="default agent.actions (LOOPWARDEN_ACTIONS_TOPIC)")
    p.add_argument("--group", metavar="ID", help="its consumer group (LOOPWARDEN_ACTIONS_GROUP; default loopwarden-actions)")
    p.add_argument("--timeout-s", dest="timeout_s", type=float, default=None,
                   help="one POST's time limit (LOOPWARDEN_ACTIONS_TIMEOUT_S; default 10)")
    p.add_argument("--max-backoff-s", dest="max_backoff_s", type=float, default=None,
                   help="longest wait between retries of one action (LOOPWARDEN_ACTIONS_MAX_BACKOFF_S; default 60)")
    p.add_argument("--metrics-port", dest="metrics_port", type=int, default=None,
                   help="Prometheus /metrics on this port; 0: none (LOOPWARDEN_ACTIONS_METRICS_PORT; default 6069)")
    p.add_argument("--metrics-host", dest="metrics_host", default=None,
                   help="its bind address (LOOPWARDEN_ACTIONS_METRICS_HOST; default 127.0.0.1)")
    p.add_argument("--log-level", dest="log_level", default="info")
    p.set_defaults(func=cmd_actions)


def _setting(args: argparse.Namespace, name: str, default=None):
    value = getattr(args, name)
    if value is None:
        value = os.environ.get(f"LOOPWARDEN_ACTIONS_{name.upper()}" if name != "actions_topic"
                               else "LOOPWARDEN_ACTIONS_TOPIC")
    return default if value is None else value


def _fail(message: str) -> SystemExit:
    return SystemExit(f"loopwarden actions: {message}")


def _number(args, name: str, default: float, flag: str, low: float, integer: bool = False):
    raw = _setting(args, name, default)
    try:
        value = int(raw) if integer else float(raw)
    except (TypeError, ValueError):
        raise _fail(f"{flag} {raw!r} is not a number") from None
    if not low <= value < float("inf"):
        raise _fail(f"{flag} must be >= {low}, got {raw!r}")
    return value


def settings_from(args: argparse.Namespace):
    """The deliverer's settings from flags and environment; each bad one is a one-line error naming it."""
    from loopwarden.actions import Settings

    webhook = _setting(args, "webhook")
    if not webhook:
        raise _fail("no webhook: give --webhook https://… (or LOOPWARDEN_ACTIONS_WEBHOOK)")
    parts = urlsplit(webhook)
    if parts.scheme != "https" or not parts.hostname:
        raise _fail(f"--webhook {webhook!r} must be an https:// URL with a host (actions go over TLS only)")
    secret = None
    secret_file = _setting(args, "secret_file")
    if secret_file:
        try:
            with open(secret_file, "rb") as f:
                secret = f.read().strip()
        except OSError as exc:
            raise _fail(f"--secret-file {secret_file!r}: cannot read it: {exc.strerror}") from None
        if len(secret) < 16:
            raise _fail(f"--secret-file {secret_file!r}: the secret must be at least 16 bytes, got {len(secret)}")
    ca_file = _setting(args, "ca_file")
    try:
        context = ssl.create_default_context(cafile=ca_file or None)
    except (OSError, ssl.SSLError) as exc:
        raise _fail(f"--ca-file {ca_file!r}: not a readable PEM CA bundle: {exc}") from None
    return Settings(
        webhook=webhook, secret=secret, ssl=context,
        topic=_setting(args, "actions_topic", "agent.actions"),
        group=_setting(args, "group", "loopwarden-actions"),
        timeout_s=_number(args, "timeout_s", 10.0, "--timeout-s", 0.001),
        max_backoff_s=_number(args, "max_backoff_s", 60.0, "--max-backoff-s", 0.001),
    )


def cmd_actions(args: argparse.Namespace) -> int:
    import logging

    from prometheus_client import start_http_server

    from loopwarden.actions import ActionMetrics, Deliverer
    from loopwarden.commands.cliutil import _client, _config, _connected, port_in_use, port_taken
    from loopwarden.engine.exceptions import TopicLayoutError
    from loopwarden.engine.security import client_options
    from loopwarden.stages.topics import partition_count

    settings = settings_from(args)
    port = _number(args, "metrics_port", 6069, "--metrics-port", 0, integer=True)
    host = _setting(args, "metrics_host", "127.0.0.1")
    config = _config(args)
    if settings.secret is None:
        logging.getLogger("loopwarden.actions").warning(
            "no --secret-file: deliveries are unsigned, and the receiver cannot tell them from a forgery")
    metrics = ActionMetrics()
    if port:
        try:
            start_http_server(port, addr=host, registry=metrics.registry)
        except OSError as exc:
            if not port_in_use(exc):
                raise
            raise SystemExit(port_taken("actions", host, port, "choose another with --metrics-port")) from None

    async def main() -> int:
        # asked with an admin request: a consumer's metadata request could let the broker create the topic
        if not await partition_count(config, settings.topic):
            raise TopicLayoutError(f"topic {settings.topic} does not exist (check --actions-topic / "
                                   "LOOPWARDEN_ACTIONS_TOPIC; a worker creates it)")
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        started = asyncio.Event()
        run = asyncio.ensure_future(Deliverer(settings, client_options(config), metrics).run(stop, started))
        await asyncio.wait([run, asyncio.ensure_future(started.wait())], return_when=asyncio.FIRST_COMPLETED)
        if started.is_set():
            _connected()
            print(f"loopwarden actions: delivering {settings.topic} to {settings.webhook}"
                  + (f" (metrics on http://{host}:{port}/metrics)" if port else ""), file=sys.stderr, flush=True)
        await run
        return 0

    return _client("actions", config, main)
