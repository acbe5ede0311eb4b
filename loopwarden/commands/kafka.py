"""The `loopwarden` commands on Kafka: their flags (``add_commands``), the worker and config-doc."""

from __future__ import annotations

import argparse
import sys

from loopwarden.commands.admin import cmd_deadletters, cmd_topics
from loopwarden.commands.clients import cmd_simulate, cmd_tail, cmd_tick
from loopwarden.commands.cliutil import (
    _common,
    _config,
    _env_epilog,
    _states_epilog,
    cannot_connect,
    port_in_use,
    port_taken,
    trusted_verifiers,
)
from loopwarden.engine.config import CLOCKS, STORES
from loopwarden.engine.exceptions import ConfigError


def add_commands(sub) -> None:
    p = worker = sub.add_parser("worker", help="run a stream-processor worker against Kafka (exactly-once)",
                       epilog=_env_epilog(), formatter_class=argparse.RawDescriptionHelpFormatter)
    _common(p, topics=("steps", "outcomes", "health", "deadletter", "ticks", "actions"))
    p.add_argument("--recovery-policies", dest="recovery_policies", metavar="FILE",
                   help="JSON or TOML: agent (or *) -> default recovery policy (LOOPWARDEN_RECOVERY_POLICIES; "
                        "docs/recovery.md)")
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
                        "while it sends a backlog, and this long after it last did; 0: never (LOOPWARDEN_ALIGN_MAX_MS; "
                        "default 1000)")
    p.add_argument("--stall-timeout-s", dest="stall_timeout_s", type=float,
                   help="a partition with lag and no progress this long is stalled (LOOPWARDEN_STALL_TIMEOUT_S; default 60)")
    p.add_argument("--max-message-bytes", dest="max_message_bytes", type=int,
                   help="largest message produced; dead letters are cut to fit (LOOPWARDEN_MAX_MESSAGE_BYTES; default 1000000)")
    p.add_argument("--session-timeout-s", dest="session_timeout_s", type=float,
                   help="consumer group session timeout (LOOPWARDEN_SESSION_TIMEOUT_S; default 6)")
    p.add_argument("--trusted-verifiers", dest="trusted_verifiers", metavar="KEY_ID=PUBLIC_KEY[,...]",
                   help="only receipts signed by these keys count (LOOPWARDEN_TRUSTED_VERIFIERS; unset: every receipt)")
    p.add_argument("--trusted-outcomes-topic", dest="trusted_outcomes_topic", metavar="TOPIC",
                   help="receipts on this topic, which only the verifiers may write (Kafka ACLs), count without a "
                        "signature check (LOOPWARDEN_TRUSTED_OUTCOMES_TOPIC; docs/receipts.md)")
    _otel_flags(p)
    p.add_argument("--otel", action="store_true",
                   help="also run the OpenTelemetry bridge in this process (otlp_spans -> agent.steps; docs/opentelemetry.md)")
    p.set_defaults(func=cmd_worker)

    p = sub.add_parser("bridge", help="run the OpenTelemetry bridge alone: spans from the Collector's Kafka exporter "
                                      "-> run events on agent.steps (exactly-once)")
    _common(p, topics=("steps", "deadletter"), partitions=False)
    _otel_flags(p)
    p.add_argument("--app-id", dest="app_id", help="its consumer group is <app id>-otel (LOOPWARDEN_APP_ID; default loopwarden)")
    p.add_argument("--web-host", dest="web_host", help="HTTP bind address for /metrics, /readyz (LOOPWARDEN_WEB_HOST)")
    p.add_argument("--web-port", dest="web_port", type=int, help="HTTP port (LOOPWARDEN_WEB_PORT; default 6066)")
    p.add_argument("--store", choices=STORES, help="trace store (LOOPWARDEN_STORE; default memory)")
    p.add_argument("--data-dir", dest="data_dir", help="RocksDB data directory (LOOPWARDEN_DATA_DIR)")
    p.add_argument("--log-level", dest="log_level", help="info, warning, debug (LOOPWARDEN_LOG_LEVEL)")
    p.set_defaults(func=cmd_bridge)

    from loopwarden.commands.verify import (
        add_verify_commands,  # verify, receipt (docs/contract.md section 10)
    )

    add_verify_commands(sub)

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
    p.add_argument("--progress-every-s", type=float, default=10.0,
                   help="while paced, a progress line this often (0: none; default 10)")
    p.add_argument("--one", metavar="RUN_ID", help="publish one run instead of a fleet: started, one step, ended "
                   "naturally, stamped now (docs/first-receipt.md)")
    p.add_argument("--expect-file", dest="expect_file", metavar="PATH",
                   help="with --one: the run declares this file as its outcome (outcome_expected, kind file, "
                        "min_size 1) for `loopwarden verify` to check")
    p.set_defaults(func=cmd_simulate)

    p = sub.add_parser("tail", help="print transitions from agent.health", epilog=_states_epilog(),
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    _common(p, topics=("health",), partitions=False)
    p.add_argument("--from-beginning", action="store_true")
    p.add_argument("--json", action="store_true", help="print the raw JSON lines")
    p.add_argument("--idle-exit-s", type=float, default=None, help="exit after this long without a message")
    p.add_argument("--run-id", dest="run_ids", action="append", metavar="RUN_ID",
                   help="only this run's transitions (repeatable)")
    p.add_argument("--state", dest="states", action="append", metavar="STATE",
                   help="only transitions to this state (repeatable; e.g. STUCK)")
    p.add_argument("--agent", dest="agents", action="append", metavar="AGENT",
                   help="only runs of this agent (repeatable)")
    p.set_defaults(func=cmd_tail)

    p = sub.add_parser("deadletters", help="print agent.deadletter: reason, source topic/partition/offset, a preview")
    _common(p, topics=("deadletter",), partitions=False)
    p.add_argument("--follow", action="store_true", help="keep printing new dead letters (default: print those there, then exit)")
    p.add_argument("--json", action="store_true", help="one JSON object per dead letter (headers, key, value as text or hex)")
    p.add_argument("--preview-bytes", type=int, default=120, help="bytes of each value shown (default 120)")
    p.set_defaults(func=cmd_deadletters)

    p = sub.add_parser("topics", help="check the topic layout, repair it (create missing topics, recreate empty "
                                      "ones of the wrong partition count), or expand it (add partitions to every "
                                      "co-partitioned topic together; runs in flight move with it)")
    p.add_argument("action", choices=("check", "repair", "expand"))
    _common(p, topics=("steps", "outcomes", "health", "deadletter", "ticks", "actions"))
    p.add_argument("--app-id", dest="app_id", help="whose changelog topic (LOOPWARDEN_APP_ID; default loopwarden)")
    p.add_argument("--otel", action="store_true",
                   help="also the OpenTelemetry bridge's topics (the otel topic and its changelog, otel_partitions "
                        "each; looked at without it when the otel topic exists)")
    _otel_flags(p, grace=False)
    p.add_argument("--to", dest="expand_to", type=int, metavar="N", help="expand: the new partition count")
    p.add_argument("--yes", action="store_true", help="repair or expand without asking")
    p.add_argument("--recreate-outputs", action="store_true",
                   help="repair: also delete and recreate an output topic (agent.health, agent.deadletter) of another "
                        "partition count that holds records (they are lost); an empty one is recreated without it")
    p.set_defaults(func=cmd_topics)

    p = sub.add_parser("config-doc", help="print docs/configuration.md: every setting, generated from Config")
    p.set_defaults(func=cmd_config_doc, worker_parser=worker)  # the worker's flags are part of the doc

    p = sub.add_parser("tick", help="send one timer tick to every partition (with --clock event: advance the clock)")
    _common(p, topics=("ticks",), partitions=False)
    p.add_argument("--now-ms", type=int, required=True, help="the clock value the workers move to")
    p.set_defaults(func=cmd_tick)


def cmd_config_doc(args: argparse.Namespace) -> int:
    from loopwarden.commands.configdoc import render

    sys.stdout.write(render(args.worker_parser))
    return 0


def _otel_flags(p: argparse.ArgumentParser, grace: bool = True) -> None:
    p.add_argument("--otel-topic", dest="otel_topic",
                   help="the Collector's Kafka exporter topic (LOOPWARDEN_OTEL_TOPIC; default otlp_spans)")
    p.add_argument("--otel-partitions", dest="otel_partitions", type=int,
                   help="partitions of the otel topic and the bridge's changelog (LOOPWARDEN_OTEL_PARTITIONS; default 8)")
    if grace:
        p.add_argument("--otel-end-grace-s", dest="otel_end_grace_s", type=float,
                       help="hold a run that did not end cleanly this long for spans ending after its run span "
                            "(LOOPWARDEN_OTEL_END_GRACE_S; default 2)")


def cmd_bridge(args: argparse.Namespace) -> int:
    from aiokafka.errors import KafkaConnectionError

    from loopwarden.stages.otel.run import run_bridge
    from loopwarden.engine.exceptions import TopicLayoutError

    config = _config(args)
    print(f"loopwarden bridge: broker={config.broker} {config.otel_topic} -> {config.steps_topic} "
          f"partitions={config.otel_partitions} http://{config.web_host}:{config.web_port}", file=sys.stderr, flush=True)
    try:
        return run_bridge(config, on_recovered=getattr(args, "on_recovered", None))
    except KafkaConnectionError as exc:
        raise SystemExit(cannot_connect("bridge", config, exc)) from None
    except TopicLayoutError as exc:
        raise SystemExit(f"loopwarden bridge: {exc}") from None
    except OSError as exc:
        if not port_in_use(exc):
            raise
        raise SystemExit(port_taken("bridge", config.web_host, config.web_port,
                                    "choose another with --web-port (LOOPWARDEN_WEB_PORT)")) from None


_LOCKS: list = []  # the data directories' lock files, held open (and so locked) until the process ends


def lock_data_dir(path) -> None:
    """Take ``<data dir>/loopwarden.lock`` for this process, or refuse: two workers writing one RocksDB
    directory would each restore the other's partitions from under it. The lock goes with the process,
    however it ends (an flock is the open file's)."""
    import fcntl

    lock = path / "loopwarden.lock"
    f = open(lock, "a")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.close()
        raise ConfigError(f"data_dir: {str(path)!r} is in use by another worker (it holds {lock}): give each worker "
                          "its own --data-dir (LOOPWARDEN_DATA_DIR)") from None
    _LOCKS.append(f)


def cmd_worker(args: argparse.Namespace) -> int:
    from loopwarden.stages.health.worker import run_worker

    config = _config(args)
    verifiers = trusted_verifiers(args.trusted_verifiers)  # docs/contract.md section 10; a bad value stops here, named
    if config.store == "rocksdb":
        from loopwarden.engine.store import prepare_data_dir

        try:
            lock_data_dir(prepare_data_dir(config.data_dir))
        except ConfigError as exc:
            raise SystemExit(f"loopwarden: {exc}") from None
    verified = f",{config.trusted_outcomes_topic} (trusted)" if config.trusted_outcomes_topic else ""
    print(f"loopwarden worker: broker={config.broker} topics={config.steps_topic},{config.outcomes_topic}{verified} -> "
          f"{config.health_topic} partitions={config.partitions} store={config.store} clock={config.clock} "
          f"http://{config.web_host}:{config.web_port}", file=sys.stderr, flush=True)
    from aiokafka.errors import KafkaConnectionError

    from loopwarden.engine.exceptions import TopicLayoutError, UntrustedChannelError

    try:
        return run_worker(config, on_recovered=getattr(args, "on_recovered", None), verifiers=verifiers,
                          beside=_bridge_beside(config, getattr(args, "on_recovered", None)) if args.otel else None)
    except KafkaConnectionError as exc:
        raise SystemExit(cannot_connect("worker", config, exc)) from None
    except (TopicLayoutError, UntrustedChannelError) as exc:
        raise SystemExit(f"loopwarden worker: {exc}") from None
    except OSError as exc:
        if not port_in_use(exc):
            raise
        raise SystemExit(port_taken("worker", config.web_host, config.web_port,
                                    "choose another with --web-port (LOOPWARDEN_WEB_PORT)")) from None


def _bridge_beside(config, on_recovered):
    """``worker --otel``: the OpenTelemetry bridge's engine, run in the worker's process with its metrics."""
    from loopwarden.engine.loop import Engine
    from loopwarden.stages.otel.stage import BridgeStage, bridge_config

    def engines(metrics) -> list[Engine]:
        bridge = bridge_config(config)
        return [Engine(bridge, BridgeStage(bridge, metrics), metrics, on_recovered)]

    return engines
