"""The OpenTelemetry bridge: spans per second through its fold, against bare TracesData decoding.

``python -m bench.otel [--runs N] [--chats N] [--tools M] [--repeats R]``

Realistic traces: a run is 1 ``invoke_agent`` span + N ``chat`` spans + M ``execute_tool`` spans
(tools spread over the model calls), with the content a runtime exports by default (messages of
about a kilobyte on every chat span, tool arguments and results), as the Collector's Kafka exporter
writes them with ``partition_traces_by_id``: one trace per message, a run's children in one message
and its run span in the next (spans are exported as they end).

Rows (medians over repeats; never asserted anywhere):
- decode-only: ``TracesData.FromString`` of every message (protobuf, nothing else);
- bridge: ``BridgeTask.fold`` over the same records in batches of 500 (decode, per-trace state,
  events encoded, changelog records encoded), committed like the engine does;
- worker (core): the events the bridge produced through the rules core (``Replay.feed`` on decoded
  events), the worker's per-event cost without Kafka, so the bridge's events/s can be set beside it.
Target (issue 19): bridge >= 0.2x decode-only in spans/s, and its events/s >= the worker core's.
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
from loopwarden.otel import BridgeTask, Limits
from loopwarden.replay import Replay

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
    store: dict = {}
    now = [int(time.time() * 1000)]  # the spans are stamped from T0 (2026-09), in the past
    task = BridgeTask(0, store, steps_topic="agent.steps", limits=Limits(end_grace_s=0), wall_ms=lambda: now[0])
    outputs = []
    t0 = time.perf_counter()
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
    return time.perf_counter() - t0, outputs


def measure(runs: int, chats: int, tools: int, repeats: int) -> dict:
    """Medians over ``repeats``: seconds of bare decoding, of the bridge fold and of replay over its events."""
    gctune.for_streaming()  # as the worker and replay run
    records, spans = traces(runs, chats, tools)

    def decode_only() -> float:
        t0 = time.perf_counter()
        for r in records:
            TracesData.FromString(r.value)
        return time.perf_counter() - t0

    decode_s, bridge_s, replay_s, events = [], [], [], []
    for _ in range(repeats):
        gc.collect()
        decode_s.append(decode_only())
        gc.collect()
        took, outputs = _bridge(records)
        bridge_s.append(took)
        decoded = [decode_input(o.value) for o in outputs]
        events = decoded
        gc.collect()
        replay = Replay()
        t0 = time.perf_counter()
        for e in decoded:
            replay.feed(e)
        replay_s.append(time.perf_counter() - t0)
    return {"records": records, "spans": spans, "events": len(events), "decode_s": median(decode_s),
            "bridge_s": median(bridge_s), "replay_s": median(replay_s)}


def otel_rows(report, quick: bool) -> None:
    """The rows of `python -m bench.run --only otel`: spans/s through the bridge fold against bare decoding."""
    m = measure(500 if quick else 2000, 5, 4, 3 if quick else 5)
    spans, n, d, b, w = m["spans"], m["events"], m["decode_s"], m["bridge_s"], m["replay_s"]
    report.add("o otel", "bare TracesData decoding (TracesData.FromString)", f"{si(spans / d)} spans/s", "")
    report.add("o otel", "bridge fold (BridgeTask.fold)", f"{si(spans / b)} spans/s, {si(n / b)} events/s",
               f"{d / b:.2f}x decode-only (target >= 0.2x)")
    report.add("o otel", "worker core over the bridge's events (Replay.feed)", f"{si(n / w)} events/s",
               f"bridge events/s : worker core {w / b:.2f}x (target >= 1x)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.otel", description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--chats", type=int, default=5, help="chat spans per run")
    parser.add_argument("--tools", type=int, default=4, help="tool spans per run")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    m = measure(args.runs, args.chats, args.tools, args.repeats)
    records, spans = m["records"], m["spans"]
    size = sum(len(r.value) for r in records)
    print(f"{args.runs:,} runs x (1 run + {args.chats} chat + {args.tools} tool spans) = {spans:,} spans "
          f"in {len(records):,} messages, {size / len(records) / 1024:.1f} KiB each")
    d, b, w, n_events = m["decode_s"], m["bridge_s"], m["replay_s"], m["events"]
    print(f"{'row':<34} {'spans/s':>10} {'events/s':>10}")
    print(f"{'decode-only (TracesData.FromString)':<34} {si(spans / d):>10} {'':>10}")
    print(f"{'bridge fold (BridgeTask.fold)':<34} {si(spans / b):>10} {si(n_events / b):>10}")
    print(f"{'worker core (Replay.feed)':<34} {'':>10} {si(n_events / w):>10}")
    print(f"bridge / decode-only: {d / b:.2f}x spans/s (target >= 0.2x); "
          f"bridge events/s / worker core events/s: {w / b:.2f}x (target >= 1x); {n_events:,} events")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
