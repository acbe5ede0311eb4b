"""The operator's commands that look at and mend the cluster: topics check|repair, deadletters."""

from __future__ import annotations

import argparse
import json
import sys
import time

from loopwarden.commands.cliutil import _client, _config, _connected, plural
from loopwarden.config import Config
from loopwarden.engine.security import client_options

def _describe(layout, config: Config) -> list[str]:
    from loopwarden.stages.topics import co_partitioned, otel_topics

    lines = []
    for topic in layout.topics:
        n = layout.counts.get(topic)
        if topic in otel_topics(config):
            if n is None:
                note = (f"missing (created with otel_partitions={config.otel_partitions} by `topics repair --otel` "
                        "or the bridge)")
            elif topic in layout.otel_wrong:
                note = f"{plural(n, 'partition')}: WRONG, otel_partitions={config.otel_partitions}"
            else:
                note = f"{plural(n, 'partition')}, ok (OpenTelemetry bridge)"
        elif n is None:
            note = f"missing (created with {plural(config.partitions, 'partition')} by the worker or `topics repair`)"
        elif topic in layout.wrong:
            note = f"{plural(n, 'partition')}: WRONG, partitions={config.partitions}"
        elif topic in co_partitioned(config):
            note = f"{plural(n, 'partition')}, ok"
        elif topic in layout.outputs_off:
            note = (f"{plural(n, 'partition')}, not {config.partitions}: a worker started while it had {config.partitions} "
                    "stays blocked (`topics repair` recreates it)")
        else:
            note = plural(n, "partition")
        lines.append(f"  {topic:<32} {note}")
    return lines


async def _topics(config: Config, args: argparse.Namespace) -> int:
    from loopwarden.stages.topics import expected, partition_count, read_layout, repair, repair_plan

    # The bridge's topics: when asked, or when the Collector's topic exists (a mismatch there shows up here).
    otel = args.otel or await partition_count(config, config.otel_topic) is not None
    if args.action == "expand":
        return await _expand(config, args, otel)
    if args.action == "check":
        layout = await read_layout(config, otel=otel)
        _connected()
        print(f"loopwarden topics: broker {config.broker}, partitions={config.partitions}"
              + (f", otel_partitions={config.otel_partitions}" if otel else ""))
        print("\n".join(_describe(layout, config)))
        trusted = await _check_trusted_topic(config)
        if layout.ok and trusted:
            print("layout ok" + (": the missing topics are created at the next start" if layout.missing else ""))
            return 0
        if layout.ok:
            return 1
        print(layout.problem(), file=sys.stderr)
        return 1
    layout, empty, full, outputs_held = await repair_plan(config, otel=otel)
    _connected()
    print(f"loopwarden topics: broker {config.broker}, partitions={config.partitions}"
          + (f", otel_partitions={config.otel_partitions}" if otel else ""))
    print("\n".join(_describe(layout, config)))
    if full:
        flag = "--otel-partitions" if full[0] in layout.otel_wrong else "--partitions"
        raise SystemExit(
            "loopwarden topics repair: " + ", ".join(f"{t} ({layout.counts[t]} partitions)" for t in full)
            + f" hold records, which repair never deletes: run with {flag} "
            + f"{layout.counts[full[0]]} to keep them, or delete them yourself (their data goes with them)")
    kept = {t: n for t, n in outputs_held.items() if n and not args.recreate_outputs}
    if kept:
        raise SystemExit("loopwarden topics repair: " + "; ".join(
            f"output {t} has {plural(layout.counts[t], 'partition')}, expected {config.partitions}, and holds records ({n} offsets)"
            for t, n in kept.items())
            + f". A worker started while it had {config.partitions} stays blocked on it. Either keep it as it is: "
            "restart the workers (each keeps the count an output has when it starts); or recreate it with "
            f"{config.partitions} partitions, deleting its records (transitions or dead letters not read yet are "
            "lost: the worker never writes them again): loopwarden topics repair "
            f"--partitions {config.partitions} --recreate-outputs --yes")
    outputs = list(outputs_held)  # empty ones, or all of them with --recreate-outputs
    empty = empty + outputs
    if not empty and not layout.missing:
        print("layout ok: nothing to repair")
        return 0
    steps = [f"delete and recreate {t} with {expected(config, t)} partitions (it has {layout.counts[t]}; "
             + (f"its {outputs_held[t]} offsets of records are deleted)" if outputs_held.get(t) else "it holds no records)")
             for t in empty]
    steps += [f"create {t} with {expected(config, t)} partitions" for t in layout.missing if t not in empty]
    print("repair will:\n" + "\n".join(f"  {step}" for step in steps))
    if not args.yes:
        if not sys.stdin.isatty():
            raise SystemExit("loopwarden topics repair: not a terminal, so not asking: run again with --yes to repair")
        if input("go ahead? [y/N] ").strip().lower() not in ("y", "yes"):
            print("nothing changed")
            return 1
    again = await repair(config, empty, otel=otel)
    print("repaired: " + "; ".join(steps))
    for topic in again:
        print(f"  {topic} came back with the broker's default count between the delete and the create (a client "
              "asked for it and the broker auto-created it): deleted and created again")
    return 0


async def _check_trusted_topic(config: Config) -> bool:
    """With a trusted receipts topic: whether the cluster enforces ACLs (said either way); True without one."""
    if not config.trusted_outcomes_topic:
        return True
    from loopwarden.stages.health.acl import problem, read_authorizer

    found = await read_authorizer(config)
    print(f"trusted receipts topic {config.trusted_outcomes_topic}: authorizer {found.describe()}; who may write it "
          "is the topic's ACLs (docs/receipts.md: `kafka-acls.sh --list --topic ...` shows them)")
    why = problem(config, found)
    if why is None:
        return True
    if config.trusted_outcomes_without_acl:
        print(f"accepted without ACLs (LOOPWARDEN_TRUSTED_OUTCOMES_WITHOUT_ACL=1): {why.split(';')[0]}")
        return True
    print(why, file=sys.stderr)
    return False


async def _expand(config: Config, args: argparse.Namespace, otel: bool = False) -> int:
    from loopwarden.stages.health.expand import expand
    from loopwarden.stages.topics import otel_topics

    if args.expand_to is None:
        raise SystemExit("loopwarden topics expand: --to N is required (the new partition count)")
    if not args.yes:
        if not sys.stdin.isatty():
            raise SystemExit("loopwarden topics expand: not a terminal, so not asking: run again with --yes to expand")
        from loopwarden.stages.topics import co_partitioned

        *rest, last = co_partitioned(config)
        print(f"expand {', '.join(rest)} and {last} to {args.expand_to} partitions, moving the runs whose partition changes (every worker must be stopped)")
        if input("go ahead? [y/N] ").strip().lower() not in ("y", "yes"):
            print("nothing changed")
            return 1
    report = await expand(config, args.expand_to)
    _connected()
    print(f"loopwarden topics: {report}")
    if otel:
        # The Collector's producer, not loopwarden, places a trace on otlp_spans: grown under a running
        # bridge, a trace's next spans would land on another partition than its state.
        print(f"the OpenTelemetry bridge's topics ({' and '.join(otel_topics(config))}) keep their partitions: the "
              "Collector places each trace by its own partitioner, so expand does not grow them; the bridge reads "
              f"them whatever the worker's count (a new count: stop the Collector and bridge, then `loopwarden topics "
              "repair --otel --otel-partitions N` once they hold no records)")
    return 0


def cmd_topics(args: argparse.Namespace) -> int:
    config = _config(args)
    return _client("topics", config, lambda: _topics(config, args))


def format_deadletter(rec, preview_bytes: int) -> dict:
    """A dead letter as a dict: its headers (error, reason, source), key, size and a preview of its value
    (text when it is UTF-8 text, else hex)."""
    headers = {k: v.decode("utf-8", "replace") for k, v in (rec.headers or ())}
    value = rec.value or b""
    head = value[:preview_bytes]
    try:
        text = head.decode("utf-8")
        preview, kind = text, "text"
        if not text.isprintable():
            raise UnicodeDecodeError("utf-8", head, 0, 1, "control characters")
    except UnicodeDecodeError:
        preview, kind = head.hex(" "), "hex"
    return {
        "partition": rec.partition, "offset": rec.offset, "ts": rec.timestamp,
        "reason": headers.get("error_reason"), "error": headers.get("error"),
        "source": f"{headers.get('source_topic')}[{headers.get('source_partition')}]@{headers.get('source_offset')}",
        "key": rec.key.decode("utf-8", "replace") if rec.key is not None else None,
        "bytes": int(headers.get("truncated", len(value))), "truncated": "truncated" in headers,
        "preview_kind": kind, "preview": preview + ("…" if len(value) > preview_bytes else ""),
    }


async def _deadletters(config: Config, args: argparse.Namespace) -> int:
    from aiokafka import AIOKafkaConsumer, TopicPartition

    from loopwarden.stages.topics import partition_count

    n = await partition_count(config, config.deadletter_topic)
    _connected()
    if not n:
        print(f"loopwarden deadletters: no topic {config.deadletter_topic} (no worker has run yet?)", file=sys.stderr)
        return 1
    consumer = AIOKafkaConsumer(**client_options(config), enable_auto_commit=False, group_id=None,
                                isolation_level="read_committed", auto_offset_reset="earliest")
    try:
        await consumer.start()
    except BaseException:
        await consumer.stop()
        raise
    try:
        tps = [TopicPartition(config.deadletter_topic, p) for p in range(n)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        ends = await consumer.end_offsets(tps)
        shown = idle = 0
        while True:
            batch = await consumer.getmany(timeout_ms=500)
            for records in batch.values():
                for rec in records:
                    d = format_deadletter(rec, args.preview_bytes)
                    shown += 1
                    if args.json:
                        print(json.dumps(d), flush=True)
                    else:
                        stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(d["ts"] / 1000))
                        cut = " (truncated)" if d["truncated"] else ""
                        print(f"{stamp}  {d['reason']}  from {d['source']}  key={d['key']}  {d['bytes']} B{cut}\n"
                              f"    error: {d['error']}\n    {d['preview_kind']}: {d['preview']}", flush=True)
            if not args.follow and not batch:
                # at the end offsets (read_committed: the last stable ones), or nothing fetched for 2 s:
                # a transaction's commit marker sits past the last record
                positions = [await consumer.position(tp) for tp in tps]
                idle += 1
                if all(pos >= ends[tp] for pos, tp in zip(positions, tps)) or idle >= 4:
                    break
            elif batch:
                idle = 0
        if not args.json:
            print(f"loopwarden deadletters: {plural(shown, 'dead letter')} on {config.deadletter_topic}", file=sys.stderr)
        return 0
    finally:
        await consumer.stop()


def cmd_deadletters(args: argparse.Namespace) -> int:
    config = _config(args)
    if args.preview_bytes < 0:
        raise SystemExit(f"loopwarden deadletters: --preview-bytes must be >= 0, got {args.preview_bytes}")
    try:
        return _client("deadletters", config, lambda: _deadletters(config, args))
    except KeyboardInterrupt:
        return 0
