"""The OpenTelemetry bridge: spans per second through its fold, against bare decoding and the worker.

``python -m bench.otel [--runs N] [--chats N] [--tools M] [--repeats R]``

Realistic traces: a run is 1 ``invoke_agent`` span + N ``chat`` spans + M ``execute_tool`` spans
(tools spread over the model calls), with the content a runtime exports by default (messages of
about a kilobyte on every chat span, tool arguments and results), as the Collector's Kafka exporter
writes them with ``partition_traces_by_id``: one trace per message, a run's children in one message
and its run span in the next (spans are exported as they end).

Rows (CPU time of this one thread, ``time.process_time``, round-robin, medians over repeats;
never asserted anywhere):
- decode-only: ``TracesData.FromString`` of every message (protobuf, nothing else);
- read floor: ``FromString`` and then reading, through opentelemetry-proto's upb objects, only
  what the bridge must read of each span (ids, times, name, status, events, every attribute's key,
  the mapped attributes' values), nothing built: the least any bridge on this package can cost;
- bridge: ``BridgeTask.fold`` over the same records in batches of 500 (decode, per-trace state,
  events encoded, changelog records encoded), committed as the engine does;
- worker fold: the worker's own fold (``PartitionTask.fold``, 8 partitions, batches of 500, store
  writes as after a commit) over the events the bridge produced, keyed and partitioned as on
  ``agent.steps``: the fold beside the fold, neither with Kafka (bench a has the worker's fold on
  the fleet; ``--kafka`` measures both stages on a broker);
- worker core: ``Replay.feed`` over the same events (the rules alone).
Targets: bridge >= 0.2x decode-only in spans/s, and its events/s >= the worker's.
"""

from __future__ import annotations

import argparse
import gc
import random
import time

from opentelemetry.proto.common.v1.common_pb2 import AnyValue, ArrayValue, InstrumentationScope, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span, Status, TracesData

from bench.common import median, si
from loopwarden import gctune
from loopwarden.codecs import decode_input
from loopwarden.stages.otel import BridgeTask, Limits
from loopwarden.stages.otel.spans import KNOWN
from loopwarden.replay import Replay
from loopwarden.rules import Settings
from loopwarden.engine.store import MemoryPartition
from loopwarden.stages.health.task import PartitionTask

T0 = 1_790_000_000_000_000_000


class _Rec:
    __slots__ = ("topic", "partition", "offset", "key", "value", "headers")

    def __init__(self, offset: int, key: bytes, value: bytes) -> None:
        self.topic, self.partition, self.offset, self.key, self.value, self.headers = \
            "otlp_spans", 0, offset, key, value, ()


def _kv(key: str, value) -> KeyValue:
    if isinstance(value, int):
        return KeyValue(key=key, value=AnyValue(int_value=value))
    if isinstance(value, list):
        return KeyValue(key=key, value=AnyValue(array_value=ArrayValue(values=[AnyValue(string_value=v) for v in value])))
    return KeyValue(key=key, value=AnyValue(string_value=value))


def _span(tid: bytes, sid: int, parent: int, name: str, start_ms: int, end_ms: int, attrs: dict) -> Span:
    return Span(trace_id=tid, span_id=sid.to_bytes(8, "big"), parent_span_id=parent.to_bytes(8, "big") if parent else b"",
                name=name, start_time_unix_nano=T0 + start_ms * 1_000_000, end_time_unix_nano=T0 + end_ms * 1_000_000,
                status=Status(), attributes=[_kv(k, v) for k, v in attrs.items()])


def _message(spans: list[Span]) -> bytes:
    return TracesData(resource_spans=[ResourceSpans(scope_spans=[ScopeSpans(
        scope=InstrumentationScope(name="pydantic-ai", version="2.68.0"), spans=spans)])]).SerializeToString()


def traces(runs: int, chats: int, tools: int, seed: int = 7) -> tuple[list[_Rec], int]:
    """Two messages per run (children, then the run span); returns the records and the span count."""
    rnd = random.Random(seed)
    text = "x" * 1000  # a kilobyte of message content per chat span
    records, offset, spans_total, sid = [], 0, 0, 1
    for r in range(runs):
        tid = rnd.getrandbits(128).to_bytes(16, "big")
        root, sid = sid, sid + 1
        agent = f"agent-{r % 20}"
        children, t = [], r * 10_000
        per_chat = [tools // chats + (1 if i < tools % chats else 0) for i in range(chats)]
        for i, n_tools in enumerate(per_chat):
            last = i == chats - 1
            children.append(_span(tid, sid, root, "chat gpt-5", t + 1, t + 50, {
                "gen_ai.operation.name": "chat", "gen_ai.agent.name": agent, "gen_ai.request.model": "gpt-5",
                "gen_ai.response.finish_reasons": ["stop" if last else "tool_calls"],
                "gen_ai.usage.input_tokens": 1200 + i, "gen_ai.usage.output_tokens": 80,
                "gen_ai.input.messages": text, "gen_ai.output.messages": text}))
            sid += 1
            t += 50
            for j in range(n_tools):
                children.append(_span(tid, sid, root, "execute_tool lookup", t + 1, t + 20, {
                    "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "lookup",
                    "gen_ai.tool.call.id": f"call_{sid}", "gen_ai.agent.name": agent,
                    "gen_ai.tool.call.arguments": text[:200], "gen_ai.tool.call.result": text[:400]}))
                sid += 1
                t += 20
        run_span = _span(tid, root, 0, f"invoke_agent {agent}", r * 10_000, t + 1, {
            "gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": agent,
            "pydantic_ai.all_messages": text * 2, "final_result": text})
        key = tid.hex().encode()
        for group in (children, [run_span]):
            records.append(_Rec(offset, key, _message(group)))
            offset += 1
        spans_total += len(children) + 1
    return records, spans_total


def _bridge(records: list[_Rec]) -> tuple[float, list]:
    """(CPU seconds, outputs) of BridgeTask.fold over ``records`` in batches of 500, committed as the engine does."""
    store: dict = {}
    now = [int(time.time() * 1000)]  # the spans are stamped from T0 (2026-09), in the past
    task = BridgeTask(0, store, steps_topic="agent.steps", limits=Limits(end_grace_s=0), wall_ms=lambda: now[0])
    outputs = []
    c0 = time.process_time()
    for i in range(0, len(records), 500):
        out = task.fold(records[i:i + 500])
        for key, raw in out.changes.items():
            if raw is None:
                store.pop(key, None)
            else:
                store[key] = raw
        task.committed(out)
        outputs += out.outputs
        if out.deadletters:
            raise SystemExit(f"the bench's own messages were dead-lettered: {out.deadletters[0].error}")
    return time.process_time() - c0, outputs


def read_floor(values: list[bytes]) -> None:
    """What the bridge must read of every span through opentelemetry-proto, and nothing more (no checks, no
    objects built): ids, times, name, status, events, each attribute's key, the mapped attributes' values."""
    known = KNOWN
    for value in values:
        for rs in TracesData.FromString(value).resource_spans:
            for ss in rs.scope_spans:
                scope = ss.scope
                scope.name, scope.version
                for sp in ss.spans:
                    sp.trace_id, sp.span_id.hex(), sp.parent_span_id.hex(), sp.name
                    sp.start_time_unix_nano, sp.end_time_unix_nano
                    for kv in sp.attributes:
                        if kv.key in known:
                            kv.value.string_value
                    if sp.events:
                        pass
                    sp.status.code


def _steps_records(outputs: list, partitions: int = 8) -> dict[int, list]:
    """The bridge's outputs as records of ``agent.steps``' partitions (keyed by run id)."""
    by_partition: dict[int, list] = {}
    for o in outputs:
        p = hash(o.key) % partitions
        part = by_partition.setdefault(p, [])
        rec = _Rec(len(part), o.key, o.value)
        rec.topic, rec.partition = "steps", p
        part.append(rec)
    return by_partition


def _worker_fold(by_partition: dict[int, list]) -> float:
    """CPU seconds of the worker's fold (PartitionTask, event clock) over the bridge's events, batches of 500."""
    roles = {"steps": "steps", "outcomes": "outcomes", "ticks": "ticks"}
    c0 = time.process_time()
    for p, records in by_partition.items():
        task = PartitionTask(p, MemoryPartition(), roles, settings=Settings(), clock="event")
        for i in range(0, len(records), 500):
            out = task.fold(records[i:i + 500], punctuate=True)
            task.store.write(out.changes, None)
            task.committed(out)
    return time.process_time() - c0


def measure(runs: int, chats: int, tools: int, repeats: int) -> dict:
    """Medians over ``repeats`` (round-robin) of the CPU seconds of each row over the same messages."""
    gctune.for_streaming()  # as the worker and replay run
    records, spans = traces(runs, chats, tools)
    values = [r.value for r in records]
    _took, outputs = _bridge(records)
    by_partition = _steps_records(outputs)
    decoded = [decode_input(o.value) for o in outputs]

    def decode_only() -> float:
        c0 = time.process_time()
        for v in values:
            TracesData.FromString(v)
        return time.process_time() - c0

    def floor() -> float:
        c0 = time.process_time()
        read_floor(values)
        return time.process_time() - c0

    def replay() -> float:
        r = Replay()
        c0 = time.process_time()
        for e in decoded:
            r.feed(e)
        return time.process_time() - c0

    rows = {"decode_s": decode_only, "floor_s": floor, "bridge_s": lambda: _bridge(records)[0],
            "worker_s": lambda: _worker_fold(by_partition), "replay_s": replay}
    times: dict[str, list[float]] = {k: [] for k in rows}
    for _ in range(repeats):
        for key, fn in rows.items():
            gc.collect()
            times[key].append(fn())
    return {"records": records, "spans": spans, "events": len(outputs), **{k: median(v) for k, v in times.items()}}


def otel_rows(report, quick: bool) -> None:
    """The rows of `python -m bench.run --only otel`: the bridge's fold against bare decoding and the worker's fold."""
    m = measure(500 if quick else 2000, 5, 4, 3 if quick else 5)
    spans, n = m["spans"], m["events"]
    d, f, b, w, r = m["decode_s"], m["floor_s"], m["bridge_s"], m["worker_s"], m["replay_s"]
    report.add("o otel", "bare TracesData decoding (TracesData.FromString)", f"{si(spans / d)} spans/s",
               f"{d / spans * 1e6:.2f} us CPU/span")
    report.add("o otel", "read floor: FromString + reading what the bridge needs (upb)", f"{si(spans / f)} spans/s",
               f"{f / spans * 1e6:.2f} us/span; {d / f:.2f}x decode-only: the best any bridge on opentelemetry-proto does")
    report.add("o otel", "bridge fold (BridgeTask.fold)", f"{si(spans / b)} spans/s, {si(n / b)} events/s",
               f"{b / spans * 1e6:.2f} us/span; {d / b:.2f}x decode-only (target >= 0.2x)")
    report.add("o otel", "worker fold over the bridge's events (PartitionTask.fold)", f"{si(n / w)} events/s",
               f"bridge events/s : worker fold events/s = {w / b:.2f}x (target >= 1x)")
    report.add("o otel", "worker core over the same events (Replay.feed)", f"{si(n / r)} events/s",
               f"bridge : worker core {r / b:.2f}x")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.otel", description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--chats", type=int, default=5, help="chat spans per run")
    parser.add_argument("--tools", type=int, default=4, help="tool spans per run")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    m = measure(args.runs, args.chats, args.tools, args.repeats)
    records, spans, n = m["records"], m["spans"], m["events"]
    size = sum(len(r.value) for r in records)
    print(f"{args.runs:,} runs x (1 run + {args.chats} chat + {args.tools} tool spans) = {spans:,} spans "
          f"in {len(records):,} messages, {size / len(records) / 1024:.1f} KiB each; {n:,} events")
    print(f"{'row (CPU time, one thread)':<44} {'spans/s':>9} {'events/s':>9} {'us/span':>8} {'us/event':>9}")
    for label, key, per_span in (("decode-only (TracesData.FromString)", "decode_s", True),
                                 ("read floor (upb reads the bridge needs)", "floor_s", True),
                                 ("bridge fold (BridgeTask.fold)", "bridge_s", True),
                                 ("worker fold (PartitionTask.fold)", "worker_s", False),
                                 ("worker core (Replay.feed)", "replay_s", False)):
        t = m[key]
        print(f"{label:<44} {si(spans / t) if per_span else '':>9} {si(n / t) if key != 'decode_s' and key != 'floor_s' else '':>9} "
              f"{t / spans * 1e6 if per_span else float('nan'):>8.2f} {t / n * 1e6:>9.2f}")
    d, f, b, w = m["decode_s"], m["floor_s"], m["bridge_s"], m["worker_s"]
    print(f"bridge / decode-only: {d / b:.2f}x spans/s (target >= 0.2x; the read floor alone: {d / f:.2f}x); "
          f"bridge events/s / worker fold events/s: {w / b:.2f}x (target >= 1x)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
