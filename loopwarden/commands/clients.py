"""The operator's Kafka client commands that publish and watch: simulate, tail, tick."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time

from loopwarden.codecs.states import STATE_TABLE
from loopwarden.commands.cliutil import _client, _config, _connected
from loopwarden.config import Config
from loopwarden.engine.security import client_options

COLORS = {s.name: s.ansi for s in STATE_TABLE}  # tail's SGR colour per state


class _Progress:
    """simulate's progress on stderr while paced at event time: a first line saying how long it takes and
    that --fast exists, then one line every ``every_s`` seconds."""

    def __init__(self, total: int, runs: int, start_ms: int, end_ms: int, every_s: float) -> None:
        self.total, self.runs, self.start_ms, self.end_ms, self.every_s = total, runs, start_ms, end_ms, every_s
        self.next_at = time.monotonic() + every_s

    def begin(self) -> None:
        span = max(0.0, (self.end_ms - self.start_ms) / 1000)
        print(f"loopwarden simulate: publishing {self.total} messages for {self.runs} runs, each at its timestamp, "
              f"over {_duration(span)} (--fast publishes them at once)", file=sys.stderr, flush=True)

    def sent(self, n: int) -> None:
        if self.every_s <= 0 or time.monotonic() < self.next_at:
            return
        self.next_at = time.monotonic() + self.every_s
        left = max(0.0, self.end_ms / 1000 - time.time())
        print(f"loopwarden simulate: {n}/{self.total} messages sent, {_duration(left)} to go (--fast: at once)",
              file=sys.stderr, flush=True)


def _duration(s: float) -> str:
    return f"{s:.0f} s" if s < 120 else f"{s / 60:.0f} min"


async def _simulate(config: Config, args: argparse.Namespace) -> int:
    from loopwarden.publisher import Publisher
    from loopwarden.simulate import fleet
    from loopwarden.stages.topics import ensure_topics

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
        progress = _Progress(len(messages), args.runs, start, max(m.ts for m in messages), args.progress_every_s)
        if not args.fast:
            progress.begin()
        for i, m in enumerate(messages):
            if not args.fast:
                delay = m.ts / 1000 - time.time()
                if delay > 0:
                    await asyncio.sleep(delay)
                progress.sent(i + 1)
            await pub.publish_raw(topics[m.topic], m.key, m.value)
        await pub.flush()
    print(f"loopwarden simulate: published {len(messages)} messages for {args.runs} runs", file=sys.stderr)
    return 0


async def _simulate_one(config: Config, args: argparse.Namespace, expect_file: str | None) -> int:
    from loopwarden.publisher import Publisher
    from loopwarden.simulate import one_run
    from loopwarden.stages.topics import ensure_topics

    await ensure_topics(config)
    async with Publisher(config.bootstrap, config.steps_topic, config.outcomes_topic,
                         options=client_options(config)) as pub:
        _connected()
        for m in one_run(args.one, int(time.time() * 1000), expect_file):
            await pub.publish_raw(config.steps_topic, m.key, m.value)
        await pub.flush()
    expecting = f"; it expects {expect_file}" if expect_file else ""
    print(f"loopwarden simulate: published run {args.one!r}: started, one step, ended{expecting}", file=sys.stderr)
    return 0


def cmd_simulate(args: argparse.Namespace) -> int:
    from loopwarden.simulate import fleet

    if args.expect_file is not None and args.one is None:
        raise SystemExit("loopwarden simulate: --expect-file is for one run: give --one RUN_ID too")
    if args.one is not None:
        from loopwarden.codecs import InvalidEvent, decode_step_event
        from loopwarden.simulate import one_run

        expect_file = None if args.expect_file is None else os.path.abspath(args.expect_file)
        try:
            for m in one_run(args.one, int(time.time() * 1000), expect_file):
                decode_step_event(m.value)  # a run id or path the processor would refuse is said here, named
        except InvalidEvent as exc:
            raise SystemExit(f"loopwarden simulate: --one {args.one!r}: {exc}") from None
        config = _config(args)
        return _client("simulate", config, lambda: _simulate_one(config, args, expect_file))
    if args.runs < 1 or not 0 < args.rate < float("inf"):
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


def tail_filter(args: argparse.Namespace):
    """A predicate over a transition dict from tail's --run-id/--state/--agent (None: everything passes)."""
    from loopwarden.codecs import STATES

    for state in args.states or ():
        if state.upper() not in STATES:  # any case: `--state false_complete` means FALSE_COMPLETE
            raise SystemExit(f"loopwarden tail: --state {state!r} is not a health state; one of {', '.join(STATES)}")
    run_ids, agents = set(args.run_ids or ()), set(args.agents or ())
    states = {state.upper() for state in args.states or ()}

    def keep(t: dict) -> bool:
        return ((not run_ids or t["run_id"] in run_ids) and (not states or t["to_state"] in states)
                and (not agents or t.get("agent") in agents))
    return keep


def format_transition(t: dict, color: bool) -> str:
    stamp = time.strftime("%H:%M:%S", time.localtime(t["ts"] / 1000))
    to = t["to_state"]
    shown = f"\x1b[{COLORS.get(to, '0')}m{to:<17}\x1b[0m" if color else f"{to:<17}"
    ev = t["evidence"]
    extra = f" disagreements={','.join(ev['disagreements'])}" if ev.get("disagreements") else ""
    return f"{stamp}  {t['run_id'][:44]:<44} {(t['from_state'] or '-'):>17} -> {shown} {t['reason']}{extra}"


async def _tail(config: Config, args: argparse.Namespace) -> int:
    from aiokafka import AIOKafkaConsumer

    from loopwarden.engine.exceptions import TopicLayoutError
    from loopwarden.stages.topics import partition_count

    # asked with an admin request first: a consumer's metadata request for a missing topic lets a broker
    # with auto.create.topics.enable create it, and a reader must never create a topic
    if not await partition_count(config, config.health_topic):
        raise TopicLayoutError(f"topic {config.health_topic} does not exist (check --health-topic / "
                               "LOOPWARDEN_HEALTH_TOPIC; a worker creates it)")
    consumer = AIOKafkaConsumer(config.health_topic, **client_options(config),
                                auto_offset_reset="earliest" if args.from_beginning else "latest",
                                enable_auto_commit=False, group_id=None, isolation_level="read_committed")
    try:
        await consumer.start()
    except BaseException:
        await consumer.stop()
        raise
    _connected()
    color = sys.stdout.isatty() and not args.json
    keep = tail_filter(args)
    try:
        while True:
            batch = await consumer.getmany(timeout_ms=int((args.idle_exit_s or 1) * 1000))
            if not batch and args.idle_exit_s is not None:
                return 0
            for records in batch.values():
                for rec in records:
                    try:
                        t = json.loads(rec.value)
                    except ValueError:
                        continue  # agent.health holds only what workers wrote; nothing else is a transition
                    if not keep(t):
                        continue
                    if args.json:
                        print(rec.value.decode(), flush=True)
                    else:
                        print(format_transition(t, color), flush=True)
    finally:
        await consumer.stop()


def cmd_tail(args: argparse.Namespace) -> int:
    config = _config(args)
    tail_filter(args)  # a wrong --state is said before connecting
    try:
        return _client("tail", config, lambda: _tail(config, args))
    except KeyboardInterrupt:
        return 0


async def _tick(config: Config, now_ms: int) -> int:
    from loopwarden.publisher import Publisher
    from loopwarden.engine.exceptions import TopicLayoutError
    from loopwarden.stages.health.task import Tick, encode_tick
    from loopwarden.stages.topics import partition_count

    # asked without a metadata request for the topic itself, which would let a broker auto-create it
    if not await partition_count(config, config.ticks_topic):
        raise TopicLayoutError(f"no topic {config.ticks_topic}: start a worker first, or run `loopwarden topics repair`")
    async with Publisher(config.bootstrap, options=client_options(config)) as pub:
        _connected()
        parts = await pub.partitions(config.ticks_topic)
        for p in sorted(parts):
            await pub.publish_raw(config.ticks_topic, None, encode_tick(Tick(now_ms=now_ms)), partition=p)
    return 0


def cmd_tick(args: argparse.Namespace) -> int:
    config = _config(args)
    return _client("tick", config, lambda: _tick(config, args.now_ms))
