"""One entry point: ``loopwarden <command>``."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
from collections.abc import Iterator
from typing import BinaryIO

CHUNK = 64 * 1024
# How replay names the trusted receipts topic in evidence when nothing names it (docs/receipts.md's example).
DEFAULT_CHANNEL = "agent.outcomes.verified"


def _chunks(f: BinaryIO) -> Iterator[bytes]:
    while chunk := f.read(CHUNK):
        yield chunk


def _numbered(paths: list[str]) -> Iterator[tuple[str, int, bytes]]:
    from loopwarden.replay import iter_lines

    for path in paths or ["-"]:
        if path == "-":
            name, f, close = "<stdin>", sys.stdin.buffer, False
        else:
            try:
                f, name, close = open(path, "rb"), path, True
            except OSError as exc:
                raise SystemExit(f"loopwarden replay: cannot read {path!r}: {exc.strerror}") from exc
        try:
            for number, line in enumerate(iter_lines(_chunks(f)), start=1):
                yield name, number, line
        finally:
            if close:
                f.close()


def cmd_replay(args: argparse.Namespace) -> int:
    from loopwarden.codecs import encode
    from loopwarden.commands.cliutil import recovery_policies, trusted_verifiers
    from loopwarden.replay import (
        Replay,
        replay_lines,
        replay_with_channel,
        summary_table,
    )
    from loopwarden.rules import Settings

    if args.advance_s < 0:
        raise SystemExit(f"loopwarden replay: --advance-s must be >= 0, got {args.advance_s}")
    out = sys.stdout.buffer
    channel = None
    if args.trusted_receipts:  # read from the verifiers' own topic: docs/receipts.md section 1a
        channel = args.trusted_outcomes_topic or os.environ.get("LOOPWARDEN_TRUSTED_OUTCOMES_TOPIC") or DEFAULT_CHANNEL
    elif args.trusted_outcomes_topic:
        raise SystemExit("loopwarden replay: --trusted-outcomes-topic names the topic the --trusted-receipts files "
                         "were read from; give those files too")
    # docs/recovery.md: a run's recovery actions are printed after the transition that caused each; a person's
    # (no transition) as it is applied.
    pending: dict[str, object] = {}

    def on_action(action):
        if ":op:" in action.action_id:
            out.write(encode(action) + b"\n")
        else:
            pending[action.action_id] = action

    replay = Replay(Settings(retention_s=args.retention_s), verifiers=trusted_verifiers(args.trusted_verifiers),
                    channel=channel, recovery_defaults=recovery_policies(args.recovery_policies, "replay"),
                    on_action=on_action if args.actions else None)

    def emit(t):
        out.write(encode(t) + b"\n")
        if pending:
            action = pending.pop(f"{t.run_id}:{t.seq}", None)
            if action is not None:
                out.write(encode(action) + b"\n")

    def bad(b):
        print(str(b), file=sys.stderr)

    if channel is None:
        invalid = replay_lines(_numbered(args.files), replay, emit, bad)
    else:
        if "-" in args.trusted_receipts:
            raise SystemExit("loopwarden replay: --trusted-receipts takes files, not '-' (stdin is for the other events)")
        invalid = replay_with_channel(_numbered(args.files), _numbered(args.trusted_receipts), replay, emit, bad)
    for t in replay.finish(args.advance_s):
        emit(t)
    out.flush()
    if args.summary:
        print(summary_table(replay), file=sys.stderr)
    if invalid:
        print(f"loopwarden replay: {invalid} invalid line(s) skipped", file=sys.stderr)
        return 1
    return 0


def cmd_keys_new(args: argparse.Namespace) -> int:
    from loopwarden.commands.cliutil import needs_extra

    needs_extra("keys", "cryptography")
    from loopwarden.trust import SigningKey, TrustConfigError

    try:
        key = SigningKey.generate(args.key_id)
        key.save(args.out)
    except TrustConfigError as exc:
        raise SystemExit(f"loopwarden keys new: {exc}") from None
    except FileExistsError:
        raise SystemExit(f"loopwarden keys new: {args.out!r} exists; refusing to overwrite a key") from None
    except OSError as exc:
        raise SystemExit(f"loopwarden keys new: cannot write {args.out!r}: {exc.strerror}") from None
    print(f"loopwarden keys new: private key written to {args.out} (mode 0600); trust it with:", file=sys.stderr)
    print(key.setting)
    return 0


def cmd_schema(args: argparse.Namespace) -> int:
    from loopwarden.codecs import json_schema

    print(json.dumps(json_schema(), indent=2, sort_keys=True))
    return 0


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if value != value or value < 0:
        raise argparse.ArgumentTypeError(f"expected a number of seconds >= 0, got {text!r}")
    return value


KAFKA_COMMANDS = {
    "worker": "run a stream-processor worker against Kafka (exactly-once)",
    "simulate": "publish a realistic mixed fleet (every state, receipts, bad messages)",
    "tail": "print transitions from agent.health",
    "tick": "send one timer tick to every partition (with --clock event: advance the clock)",
    "topics": "check the topic layout, or repair it",
    "deadletters": "print agent.deadletter: reason, source, offset, a preview",
    "verify": "check declared outcomes at their destinations; publish signed receipts",
    "receipt": "publish a person's signed decision on a run's outcome (verifier: human)",
    "act": "publish a person's signed action on a run: retry, reverify, escalate, abandon, acknowledge",
    "bridge": "run the OpenTelemetry bridge: spans from the Collector's Kafka exporter -> run events",
    "board": "serve the runs board: the whole fleet's runs from agent.health, live in a browser",
    "actions": "deliver each recovery action on agent.actions to the fleet's controller (HTTPS webhook, HMAC-signed)",
}


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("loopwarden")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown (not installed)"


def _needs_processor(args: argparse.Namespace) -> int:
    raise SystemExit(f"loopwarden {args.command}: needs the Kafka processor, which is not installed: "
                     "pip install 'loopwarden[processor]'")


def cmd_dev(args: argparse.Namespace) -> int:
    raise SystemExit(
        "loopwarden dev: the demo (a local Kafka broker, a worker and a simulated fleet) runs from a source "
        "checkout, which has the broker's Maven build: git clone the loopwarden repository, then `make dev`. "
        "With this installed package, run a worker against your Kafka: loopwarden worker --broker HOST:9092")


def build_parser(processor: bool | None = None) -> argparse.ArgumentParser:
    """The CLI; ``processor``: whether the [processor] extra's commands exist (default: if aiokafka is installed)."""
    parser = argparse.ArgumentParser(
        prog="loopwarden",
        description="Per-run health of AI agent fleets: why each run stopped, and whether the work got done.",
    )
    parser.add_argument("--version", action="version", version=f"loopwarden {_version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("replay", help="classify JSON-lines events offline (event-time clock)")
    p.add_argument("files", nargs="*", metavar="FILE", help="JSON-lines files; stdin when none or '-'")
    p.add_argument("--advance-s", type=_positive_float, default=0.0, metavar="SECONDS",
                   help="after the last event, advance the clock by this much and fire due timers (default 0)")
    p.add_argument("--summary", action="store_true", help="print a table of final states and reasons on stderr")
    p.add_argument("--retention-s", type=_positive_float, default=7 * 86400, metavar="SECONDS",
                   help="drop settled runs and orphan receipts after this long without events (default 7 days)")
    p.add_argument("--trusted-verifiers", metavar="KEY_ID=PUBLIC_KEY[,...]", default=None,
                   help="only receipts signed by these keys count (default: LOOPWARDEN_TRUSTED_VERIFIERS; unset: all)")
    p.add_argument("--trusted-receipts", action="append", default=[], metavar="FILE",
                   help="receipts read from the verifiers' own topic (LOOPWARDEN_TRUSTED_OUTCOMES_TOPIC): they count "
                        "without a signature, merged with the other events by ts; receipts elsewhere then count only "
                        "when signed by --trusted-verifiers (repeatable)")
    p.add_argument("--trusted-outcomes-topic", metavar="TOPIC", default=None,
                   help=f"the topic those files were read from, named in evidence.receipt_trust "
                        f"(default: LOOPWARDEN_TRUSTED_OUTCOMES_TOPIC, else {DEFAULT_CHANNEL})")
    p.add_argument("--actions", action="store_true",
                   help="also print each recovery action (type recovery_action) after the transition that caused it "
                        "(docs/recovery.md)")
    p.add_argument("--recovery-policies", metavar="FILE", default=None,
                   help="JSON or TOML: agent (or *) -> default recovery policy (default: LOOPWARDEN_RECOVERY_POLICIES)")
    p.set_defaults(func=cmd_replay)

    p = sub.add_parser("keys", help="signing keys of verifiers and people (signed receipts)")
    keys = p.add_subparsers(dest="keys_command", required=True, metavar="SUBCOMMAND")
    k = keys.add_parser("new", help="make an Ed25519 key pair: private key file (0600), public key printed")
    k.add_argument("--key-id", required=True, help="the id receipts name in signature.key_id")
    k.add_argument("--out", required=True, metavar="FILE", help="where to write the private key (must not exist)")
    k.set_defaults(func=cmd_keys_new)

    p = sub.add_parser("schema", help="print the JSON Schema of every input and output event")
    p.set_defaults(func=cmd_schema)

    p = sub.add_parser("dev", help="the local demo: from a source checkout, `make dev` (says how)", add_help=False)
    p.set_defaults(func=cmd_dev)

    if processor is None:
        processor = importlib.util.find_spec("aiokafka") is not None  # the [processor] extra is installed
    if processor:
        from loopwarden.commands.kafka import add_commands

        add_commands(sub)
        from loopwarden.commands.board import add_command as add_board

        add_board(sub)
        from loopwarden.commands.actions import add_command as add_actions

        add_actions(sub)
        from loopwarden.commands.act import add_command as add_act

        add_act(sub)
    else:  # listed anyway, so that asking for one says what to install instead of "invalid choice"
        for name, text in KAFKA_COMMANDS.items():
            p = sub.add_parser(name, help=f"{text} [needs loopwarden[processor]]", add_help=False)
            p.set_defaults(func=_needs_processor)
    return parser


# The commands that run until stopped, by SIGTERM or SIGINT.
SERVICES = frozenset(("worker", "bridge", "board", "verify", "actions"))


def set_up_process(args: argparse.Namespace) -> None:
    """The process's logging, log filters, garbage collector and SIGINT, by command: the one place that sets them.

    The worker logs at its configured level with aiokafka's repeated lines rate-limited, and
    freezes its restored states out of the collector after each assignment (``args.on_recovered``);
    the Kafka client commands log warnings only; replay and the worker collect rarely (``gctune``)."""
    import logging
    import signal

    from loopwarden import gctune

    command = args.command
    if command in SERVICES and signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        # A shell script's background job starts with SIGINT ignored. A service's event loop takes SIGINT as a stop
        # once its handler is in place; a Ctrl-C or `kill -INT` before that (its first second) would be lost and
        # the service would run on. From here such a signal is the clean "interrupted" exit until the handler is in.
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if command in ("replay", "worker", "bridge"):
        gctune.for_streaming()  # fewer collector passes: a batch allocates many short-lived objects
    if command in ("worker", "bridge") and args.func is not _needs_processor:
        from loopwarden.commands.cliutil import _config, _watch_startup
        from loopwarden.commands.logs import quiet_fence_leftovers, quiet_repeats

        level = _config(args).log_level.upper()
        quiet_repeats()
        quiet_fence_leftovers()  # a fence is the engine's one warning, not three of aiokafka's futures' tracebacks
        for name in ("aiokafka", "aiohttp.access"):  # their INFO lines (joins, coordinators) say nothing a user needs
            logging.getLogger(name).setLevel(max(logging.WARNING, logging.getLevelName(level)))
        logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        _watch_startup(passthrough=True)  # the worker logs aiokafka's lines; a connection error only in the exit line
        args.on_recovered = _recovered
    elif command in ("board", "verify", "actions") and args.func is not _needs_processor:  # services: they log what they do
        if command == "board":
            from loopwarden.commands.cliutil import _config

            level = _config(args).log_level.upper()
        else:
            level = args.log_level.upper()
        logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        logging.getLogger("aiokafka").setLevel(logging.WARNING)
        if command == "board":  # a broker it cannot reach at start is its exit line, not aiokafka's ERROR before it
            from loopwarden.commands.cliutil import _watch_startup
            from loopwarden.commands.logs import quiet_repeats

            quiet_repeats()
            _watch_startup(passthrough=True)
    elif command in KAFKA_COMMANDS and args.func is not _needs_processor:  # a client command: warnings only
        from loopwarden.commands.cliutil import _watch_startup
        from loopwarden.commands.logs import quiet_repeats

        logging.basicConfig(level=logging.WARNING, format=f"loopwarden {command}: %(name)s: %(message)s")
        quiet_repeats()
        _watch_startup(passthrough=False)


def _recovered() -> None:
    """After an assignment is recovered: the broker was reached, and the restored states are frozen."""
    from loopwarden.commands.cliutil import _connected

    _connected()
    _freeze_restored()


def _freeze_restored() -> None:
    """Restored states are long-lived: keep them out of every later collection."""
    import gc

    gc.collect()
    gc.freeze()


def main(argv: list[str] | None = None, processor: bool | None = None) -> int:
    try:
        parser = build_parser(processor)
        args, extra = parser.parse_known_args(argv)
        if extra and args.func not in (_needs_processor, cmd_dev):  # a command without the extra takes any flags: it only explains
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        set_up_process(args)
        return args.func(args)
    except KeyboardInterrupt:  # Ctrl-C before a command's own handler is in place (imports, start-up): no traceback
        print("loopwarden: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader went away (`loopwarden schema | head`)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # so the exit's flush of stdout is quiet
        return 141


if __name__ == "__main__":
    sys.exit(main())
