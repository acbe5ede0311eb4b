"""Kafka-side commands: worker, simulate, tail, tick."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
import time
from dataclasses import fields

from loopwarden.streams.config import CLOCKS, STORES, Config, from_env
from loopwarden.streams.exceptions import ConfigError
from loopwarden.streams.security import MECHANISMS, PROTOCOLS, client_options

COLORS = {
    "RUNNING": "36", "WAITING": "33", "WAITING_UNROUTED": "33;1", "STUCK": "35;1", "BOUNDED_STOP": "34",
    "FAILED": "31;1", "VERIFYING": "37", "VERIFIED_COMPLETE": "32;1", "FALSE_COMPLETE": "31", "UNCERTAIN": "35",
}


class _UntilConnected(logging.Filter):
    """Holds back aiokafka's lines until the command's client has connected (``passthrough`` lets them
    through, for the worker's log) and keeps the last connection error: a broker that cannot be
    reached at start is then said once, by the command, with aiokafka's reason."""

    connected = False
    passthrough = False
    last_error: str | None = None

    def filter(self, record: logging.LogRecord) -> bool:
        if not self.connected:
            text = record.getMessage()
            if text.startswith("Unable connect to "):
                self.last_error = text.split(": ", 1)[-1]
        return self.connected or self.passthrough


_STARTUP = _UntilConnected()


def _connected() -> None:
    _STARTUP.connected = True


def _watch_startup(passthrough: bool) -> None:
    from loopwarden.streams.logs import NOISY

    _STARTUP.passthrough = passthrough
    for name in NOISY:
        logging.getLogger(name).addFilter(_STARTUP)


def cannot_connect(command: str, config: Config, exc: BaseException) -> str:
    """One line: where, aiokafka's reason, and which settings to check."""
    reason = _STARTUP.last_error or f"{type(exc).__name__}: {exc}"
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


def _client(command: str, config: Config, coro_fn):
    """Run a Kafka client command: a broker that cannot be reached or refuses the credentials is one line
    saying why (exit 1). (Its logging is set by ``loopwarden.cli.set_up_process``.)"""
    from aiokafka.errors import KafkaConnectionError

    try:
        return asyncio.run(coro_fn())
    except KafkaConnectionError as exc:
        raise SystemExit(cannot_connect(command, config, exc)) from None


def _config(args: argparse.Namespace) -> Config:
    # A flag is the Config field of the same name (dest); a command without it leaves the env's value.
    overrides = {f.name: getattr(args, f.name, None) for f in fields(Config)}
    try:
        return from_env(overrides)
    except ConfigError as exc:
        raise SystemExit(f"loopwarden: {exc}") from None


def _common(p: argparse.ArgumentParser, *, topics: tuple[str, ...] = ("steps", "outcomes", "health", "deadletter", "ticks"),
            partitions: bool = True) -> None:
    """The connection flags, and the topic flags of the topics the command uses (no others: a flag a
    command would ignore is refused)."""
    p.add_argument("--broker", help="Kafka bootstrap host:port[,host:port] (env LOOPWARDEN_BROKER; default 127.0.0.1:9092)")
    defaults = {"steps": "agent.steps", "outcomes": "agent.outcomes", "health": "agent.health",
                "deadletter": "agent.deadletter", "ticks": "loopwarden.ticks"}
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
    for f in fields(Config):
        default = getattr(Config(), f.name)
        shown = "unset" if default is None else default
        lines.append(f"  LOOPWARDEN_{f.name.upper():<22} default {shown}")
    return "\n".join(lines)


def add_commands(sub) -> None:
    p = sub.add_parser("worker", help="run a stream-processor worker against Kafka (exactly-once)",
                       epilog=_env_epilog(), formatter_class=argparse.RawDescriptionHelpFormatter)
    _common(p)
    p.add_argument("--app-id", dest="app_id", help="consumer group / table prefix (LOOPWARDEN_APP_ID; default loopwarden)")
    p.add_argument("--store", choices=STORES, help="table store (LOOPWARDEN_STORE; default memory)")
    p.add_argument("--data-dir", dest="data_dir", help="RocksDB data directory (LOOPWARDEN_DATA_DIR)")
    p.add_argument("--web-host", dest="web_host", help="HTTP bind address (LOOPWARDEN_WEB_HOST; default 127.0.0.1)")
    p.add_argument("--web-port", dest="web_port", type=int, help="HTTP port (LOOPWARDEN_WEB_PORT; default 6066)")
    p.add_argument("--canonical-url", dest="canonical_url",
                   help="URL peers use to reach this worker (LOOPWARDEN_CANONICAL_URL; default http://<web host>:<port>)")
    p.add_argument("--clock", choices=CLOCKS, help="timer clock: wall (processing time) or event (LOOPWARDEN_CLOCK)")
    p.add_argument("--tick-interval-s", dest="tick_interval_s", type=float, help="timer tick period (default 1.0)")
    p.add_argument("--shutdown-timeout-s", dest="shutdown_timeout_s", type=float,
                   help="exit at the latest this long after SIGTERM/SIGINT (LOOPWARDEN_SHUTDOWN_TIMEOUT_S; default 30)")
    p.add_argument("--retention-s", dest="retention_s", type=float, help="drop settled runs after this (default 7 days)")
    p.add_argument("--max-future-skew-s", dest="max_future_skew_s", type=float,
                   help="dead-letter events and ticks stamped further ahead of the wall clock "
                        "(LOOPWARDEN_MAX_FUTURE_SKEW_S; default 300)")
    p.add_argument("--seq-memory-s", dest="seq_memory_s", type=float,
                   help="keep a dropped run's last seq this long, so its seq never repeats "
                        "(LOOPWARDEN_SEQ_MEMORY_S; default 30 days)")
    p.add_argument("--malloc-trim-s", dest="malloc_trim_s", type=float,
                   help="hand the C heap's free pages back to the OS this often; 0: never "
                        "(LOOPWARDEN_MALLOC_TRIM_S; default 30)")
    p.add_argument("--log-level", dest="log_level", help="info, warning, debug (LOOPWARDEN_LOG_LEVEL)")
    p.add_argument("--batch-max-records", dest="batch_max_records", type=int,
                   help="records per batch at most (LOOPWARDEN_BATCH_MAX_RECORDS; default 20000)")
    p.add_argument("--batch-wait-ms", dest="batch_wait_ms", type=int,
                   help="how long a batch waits for records at most (LOOPWARDEN_BATCH_WAIT_MS; default 5)")
    p.add_argument("--commit-gap-ms", dest="commit_gap_ms", type=int,
                   help="a partition's next transaction starts this long after its last commit at the earliest "
                        "(LOOPWARDEN_COMMIT_GAP_MS; default 6)")
    p.add_argument("--align-max-ms", dest="align_max_ms", type=int,
                   help="records of one input stamped after all the other, lagging, input has shown wait for it "
                        "this long at most; 0: never (LOOPWARDEN_ALIGN_MAX_MS; default 1000)")
    p.add_argument("--stall-timeout-s", dest="stall_timeout_s", type=float,
                   help="a partition with lag and no progress this long is stalled (LOOPWARDEN_STALL_TIMEOUT_S; default 60)")
    p.add_argument("--max-message-bytes", dest="max_message_bytes", type=int,
                   help="largest message produced; dead letters are cut to fit (LOOPWARDEN_MAX_MESSAGE_BYTES; default 1000000)")
    p.add_argument("--session-timeout-s", dest="session_timeout_s", type=float,
                   help="consumer group session timeout (LOOPWARDEN_SESSION_TIMEOUT_S; default 6)")
    p.set_defaults(func=cmd_worker)

    p = sub.add_parser("simulate", help="publish a realistic mixed fleet (every state, receipts, bad messages)")
    _common(p)
    p.add_argument("--runs", type=int, default=200, help="number of runs (default 200)")
    p.add_argument("--rate", type=float, default=5.0, help="runs started per second (default 5)")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--fast", action="store_true", help="publish as fast as possible (timestamps still spread at --rate, ending now)")
    p.add_argument("--out", help="write the messages as JSON lines (invalid ones included) to this file instead of publishing")
    p.add_argument("--inactivity-s", type=float, default=300.0, help="policy inactivity_timeout_s of simulated runs")
    p.add_argument("--window-s", type=float, default=600.0, help="policy receipt_window_s of simulated runs")
    p.add_argument("--bad-every", type=int, default=100, help="one invalid message after every N runs (0: none)")
    p.set_defaults(func=cmd_simulate)

    p = sub.add_parser("tail", help="print transitions from agent.health")
    _common(p, topics=("health",), partitions=False)
    p.add_argument("--from-beginning", action="store_true")
    p.add_argument("--json", action="store_true", help="print the raw JSON lines")
    p.add_argument("--idle-exit-s", type=float, default=None, help="exit after this long without a message")
    p.set_defaults(func=cmd_tail)

    p = sub.add_parser("tick", help="send one timer tick to every partition (with --clock event: advance the clock)")
    _common(p, topics=("ticks",), partitions=False)
    p.add_argument("--now-ms", type=int, required=True, help="the clock value the workers move to")
    p.set_defaults(func=cmd_tick)


def cmd_worker(args: argparse.Namespace) -> int:
    from loopwarden.streams.worker import run_worker

    config = _config(args)
    if config.store == "rocksdb":
        from loopwarden.streams.store import prepare_data_dir

        try:
            prepare_data_dir(config.data_dir)
        except ConfigError as exc:
            raise SystemExit(f"loopwarden: {exc}") from None
    print(f"loopwarden worker: broker={config.broker} topics={config.steps_topic},{config.outcomes_topic} -> "
          f"{config.health_topic} partitions={config.partitions} store={config.store} clock={config.clock} "
          f"http://{config.web_host}:{config.web_port}", file=sys.stderr, flush=True)
    from aiokafka.errors import KafkaConnectionError

    try:
        return run_worker(config, on_recovered=getattr(args, "on_recovered", None))
    except KafkaConnectionError as exc:
        raise SystemExit(cannot_connect("worker", config, exc)) from None


async def _simulate(config: Config, args: argparse.Namespace) -> int:
    from loopwarden.publisher import Publisher
    from loopwarden.simulate import fleet
    from loopwarden.streams.topics import ensure_topics

    await ensure_topics(config)  # before the broker auto-creates them with the wrong partition count

    def make(start_ms: int) -> list:
        return fleet(args.runs, seed=args.seed, start_ms=start_ms, rate=args.rate,
                     timers_s=(args.inactivity_s, args.window_s), bad_every=args.bad_every)

    topics = {"steps": config.steps_topic, "outcomes": config.outcomes_topic}
    async with Publisher(config.bootstrap, config.steps_topic, config.outcomes_topic,
                         options=client_options(config)) as pub:
        _connected()
        if args.fast:  # sent at once: stamped so the last event is now (a worker refuses ts far in its future)
            start = int(time.time() * 1000)
            messages = make(start)
            start -= max(m.ts for m in messages) - start
            messages = make(start)
        else:
            # Each event is sent at its ts, so the worker's latency histogram measures the worker: the fleet
            # starts once the producer is connected and the fleet is built (twice the time to build it ahead).
            t = time.monotonic()
            make(int(time.time() * 1000))
            start = int(time.time() * 1000) + int(2000 * (time.monotonic() - t)) + 20
            messages = make(start)
        for m in messages:
            if not args.fast:
                delay = m.ts / 1000 - time.time()
                if delay > 0:
                    await asyncio.sleep(delay)
            await pub.publish_raw(topics[m.topic], m.key, m.value)
        await pub.flush()
    print(f"loopwarden simulate: published {len(messages)} messages for {args.runs} runs", file=sys.stderr)
    return 0


def cmd_simulate(args: argparse.Namespace) -> int:
    from loopwarden.simulate import fleet

    if args.runs < 1 or args.rate <= 0:
        raise SystemExit(f"loopwarden simulate: --runs must be >= 1 and --rate > 0, got {args.runs} and {args.rate}")
    if args.out:
        messages = fleet(args.runs, seed=args.seed, rate=args.rate, timers_s=(args.inactivity_s, args.window_s),
                         bad_every=args.bad_every)
        with open(args.out, "wb") as f:
            for m in messages:
                f.write(m.value + b"\n")
        print(f"loopwarden simulate: wrote {len(messages)} lines to {args.out}", file=sys.stderr)
        return 0
    config = _config(args)
    try:
        return _client("simulate", config, lambda: _simulate(config, args))
    except KeyboardInterrupt:  # Ctrl-C (also reaches it as a child of `loopwarden dev`)
        print("loopwarden simulate: interrupted", file=sys.stderr)
        return 130


def format_transition(t: dict, color: bool) -> str:
    stamp = time.strftime("%H:%M:%S", time.localtime(t["ts"] / 1000))
    to = t["to_state"]
    shown = f"\x1b[{COLORS.get(to, '0')}m{to:<17}\x1b[0m" if color else f"{to:<17}"
    ev = t["evidence"]
    extra = f" disagreements={','.join(ev['disagreements'])}" if ev.get("disagreements") else ""
    return f"{stamp}  {t['run_id'][:44]:<44} {(t['from_state'] or '-'):>17} -> {shown} {t['reason']}{extra}"


async def _tail(config: Config, args: argparse.Namespace) -> int:
    from aiokafka import AIOKafkaConsumer

    consumer = AIOKafkaConsumer(config.health_topic, **client_options(config),
                                auto_offset_reset="earliest" if args.from_beginning else "latest",
                                enable_auto_commit=False, group_id=None)
    try:
        await consumer.start()
    except BaseException:
        await consumer.stop()
        raise
    _connected()
    color = sys.stdout.isatty() and not args.json
    try:
        while True:
            batch = await consumer.getmany(timeout_ms=int((args.idle_exit_s or 1) * 1000))
            if not batch and args.idle_exit_s is not None:
                return 0
            for records in batch.values():
                for rec in records:
                    if args.json:
                        print(rec.value.decode(), flush=True)
                    else:
                        print(format_transition(json.loads(rec.value), color), flush=True)
    finally:
        await consumer.stop()


def cmd_tail(args: argparse.Namespace) -> int:
    config = _config(args)
    try:
        return _client("tail", config, lambda: _tail(config, args))
    except KeyboardInterrupt:
        return 0


async def _tick(config: Config, now_ms: int) -> int:
    from loopwarden.publisher import Publisher
    from loopwarden.streams.task import Tick, encode_tick

    async with Publisher(config.bootstrap, options=client_options(config)) as pub:
        _connected()
        parts = await pub.partitions(config.ticks_topic)
        for p in sorted(parts):
            await pub.publish_raw(config.ticks_topic, None, encode_tick(Tick(now_ms=now_ms)), partition=p)
    return 0


def cmd_tick(args: argparse.Namespace) -> int:
    config = _config(args)
    return _client("tick", config, lambda: _tick(config, args.now_ms))
