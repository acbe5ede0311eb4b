"""``loopwarden verify`` (the destination verifier) and ``loopwarden receipt`` (a person's decision)."""

from __future__ import annotations

import argparse
import asyncio
import signal
import time


def add_verify_commands(sub) -> None:
    p = sub.add_parser("verify", help="check declared outcomes at their destinations; publish signed receipts")
    p.add_argument("--config", metavar="FILE", help="the verifier's TOML config: allow-lists, credentials, limits "
                   "(docs/receipts.md)")
    p.add_argument("--broker", help="Kafka bootstrap host:port (default: the config's, else 127.0.0.1:9092)")
    p.add_argument("--signing-key", dest="signing_key", metavar="FILE",
                   help="the key file from `loopwarden keys new` (default: the config's signing_key)")
    p.add_argument("--web-port", dest="web_port", type=int, help="/metrics, /healthz and webhooks (default 6068)")
    p.add_argument("--trusted-outcomes-topic", dest="trusted_outcomes_topic", metavar="TOPIC",
                   help="publish receipts here, the topic only verifiers may write (LOOPWARDEN_TRUSTED_OUTCOMES_TOPIC; "
                        "default: the config's, else outcomes_topic; docs/receipts.md)")
    p.add_argument("--log-level", default="info")
    p.set_defaults(func=cmd_verify)

    p = sub.add_parser("receipt", help="publish a person's signed decision on a run's outcome (verifier: human)")
    p.add_argument("run_id", metavar="RUN_ID")
    p.add_argument("--kind", required=True, choices=("file", "record", "message", "deployment", "analysis", "other"))
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--verified", dest="verified", action="store_true", help="the outcome is there and right")
    g.add_argument("--rejected", dest="verified", action="store_false", help="the outcome is absent or wrong")
    p.add_argument("--key", required=True, metavar="FILE", help="the person's key file (`loopwarden keys new`)")
    p.add_argument("--receipt-id", dest="receipt_id",
                   help="default human:<kind>:<key id>; an expectation's id answers that expectation")
    p.add_argument("--run-started-ts", dest="run_started_ts", type=int, metavar="MS",
                   help="the ts (ms) of the run_started of the run decided on: signed, so the receipt cannot count for "
                        "a later run with the same id (default: none; the receipt's own ts, now, stands in)")
    p.add_argument("--note-code", dest="note_code", help="a short content-free code kept in evidence (e.g. a ticket id)")
    p.add_argument("--broker", default=None, help="Kafka bootstrap host:port (LOOPWARDEN_BROKER; default 127.0.0.1:9092)")
    p.add_argument("--outcomes-topic", dest="outcomes_topic", default=None)
    p.add_argument("--out", metavar="FILE", help="write the signed receipt as a JSON line here ('-': stdout) instead of publishing")
    p.set_defaults(func=cmd_receipt)


def _key(path: str | None, command: str):
    from loopwarden.trust import SigningKey, TrustConfigError

    if not path:
        raise SystemExit(f"loopwarden {command}: no signing key: give --signing-key FILE or signing_key in the config")
    try:
        return SigningKey.load(path)
    except TrustConfigError as exc:
        raise SystemExit(f"loopwarden {command}: {exc}") from None


def cmd_verify(args: argparse.Namespace) -> int:
    from loopwarden.engine.exceptions import ConfigError
    from loopwarden.verify import config as vconfig
    from loopwarden.verify.service import kafka_options, run

    try:
        config = vconfig.load(args.config, {"broker": args.broker, "signing_key": args.signing_key,
                                            "web_port": args.web_port,
                                            "trusted_outcomes_topic": args.trusted_outcomes_topic})
        kafka_options(config)  # TLS/SASL settings checked before anything starts
    except (vconfig.VerifyConfigError, ConfigError) as exc:
        raise SystemExit(f"loopwarden verify: {exc}") from None
    _check_extra(config)
    key = _key(config.signing_key, "verify")
    # logging: loopwarden.cli.set_up_process

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await run(config, key, stop)

    from loopwarden.commands.cliutil import port_in_use, port_taken

    from aiokafka.errors import KafkaConnectionError

    try:
        asyncio.run(main())
    except KafkaConnectionError as exc:
        raise SystemExit(f"loopwarden verify: cannot connect to Kafka at {config.broker}: {exc}; is the broker up? "
                         "(--broker, or broker in the config)") from None
    except OSError as exc:
        if not port_in_use(exc):
            raise
        raise SystemExit(port_taken("verify", config.web_host, config.web_port,
                                    "choose another with --web-port or web_port in the config")) from None
    return 0


# The checkers' own drivers, in the `verify` extra: config section -> module it needs.
EXTRA_MODULES = (("databases", "[postgresql]", "asyncpg"), ("json_schemas", "[json_schemas]", "jsonschema"))


def _check_extra(config) -> None:
    """A section whose checker cannot run without the `verify` extra is refused now, in one line, rather
    than failing every check of it later (and ending those runs FALSE_COMPLETE)."""
    import importlib.util

    for field, section, module in EXTRA_MODULES:
        if getattr(config, field) and importlib.util.find_spec(module) is None:
            raise SystemExit(f"loopwarden verify: the config's {section} needs {module}, from the 'verify' extra: "
                             "pip install 'loopwarden[verify]'")


def cmd_receipt(args: argparse.Namespace) -> int:
    import os

    import msgspec

    from loopwarden.codecs import InvalidEvent, OutcomeReceipt, decode_outcome_event, encode

    key = _key(args.key, "receipt")
    evidence = {"decided_by": key.key_id}
    if args.note_code:
        evidence["note_code"] = args.note_code[:200]
    try:
        receipt = key.sign(OutcomeReceipt(
            run_id=args.run_id, ts=int(time.time() * 1000), receipt_id=args.receipt_id or f"human:{args.kind}:{key.key_id}",
            kind=args.kind, verifier="human", verified=args.verified, evidence=evidence,
            run_started_ts=msgspec.UNSET if args.run_started_ts is None else args.run_started_ts))
        decode_outcome_event(encode(receipt))  # what the processor would accept (lengths, ids)
    except InvalidEvent as exc:
        raise SystemExit(f"loopwarden receipt: {exc}") from None
    topic = args.outcomes_topic or os.environ.get("LOOPWARDEN_OUTCOMES_TOPIC", "agent.outcomes")
    from loopwarden.commands.cliutil import publish_signed

    publish_signed("receipt", receipt, args.out, args.broker, topic, "outcomes",
                   f"published {receipt.receipt_id!r} for run {args.run_id!r} (verified={args.verified}, "
                   f"signed by {key.key_id!r})")
    return 0
