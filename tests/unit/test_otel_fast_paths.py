"""The bridge's hot-path copies agree with the plain versions they copy, on generated input.

``spans.decode_proto`` reads only the mapped attributes' values, the common types inline,
and chooses the row of a known scope once per ScopeSpans (docs/opentelemetry.md,
"Performance"); ``spans.decode_proto_reference`` converts every mapped attribute and then
checks it, choosing the row per span. Both must give the same spans, or refuse a message
for the same reason with the same words. ``engine.assignment.murmur2`` (the default
partitioner's hash of every event's run id, which the bridge leaves to the partitioner) is
murmurhash2's native MurmurHash2 with Kafka's seed; it must equal aiokafka's byte-by-byte one,
and ``partition_of`` (its call inline) must pick aiokafka's partition.
"""

from __future__ import annotations

from aiokafka.partitioner import murmur2 as aiokafka_murmur2
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, ArrayValue, InstrumentationScope, KeyValue, KeyValueList
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span, Status, TracesData

from loopwarden.stages.otel.mapping import RUNTIMES
from loopwarden.stages.otel.spans import KNOWN, BadTraces, decode_proto, decode_proto_reference
from loopwarden.engine import outputs as routing
from loopwarden.engine.assignment import murmur2, partition_of
from loopwarden.engine.outputs import Router

SCOPES = [s for row in RUNTIMES for s in row.scopes] + ["", "my.own.instrumentation"]
KEYS = sorted(KNOWN) + ["gen_ai.input.messages", "gen_ai.request.model", "exception.type", "other"]
STRINGS = ["", "chat", "invoke_agent", "execute_tool", "agent_step", "LLM", "TOOL", "CHAIN", "AGENT", "stop",
           "tool_calls", "ApprovalRequired", "ai.generateText", '{"ls_integration": "langgraph"}', "x" * 300]
SHORT_TEXT = st.sampled_from(STRINGS)


@st.composite
def any_values(draw, depth: int = 0) -> AnyValue:
    """An AnyValue of any kind: the types a mapped key wants and the ones it must refuse."""
    kind = draw(st.sampled_from(["string", "string", "int", "int", "bool", "double", "bytes", "array", "kvlist", "none"]))
    if kind == "string":
        return AnyValue(string_value=draw(SHORT_TEXT))
    if kind == "int":
        return AnyValue(int_value=draw(st.sampled_from([0, 1, 80, 1200, -1, 2**53 - 1, 2**53, -(2**63)])))
    if kind == "bool":
        return AnyValue(bool_value=draw(st.booleans()))
    if kind == "double":
        return AnyValue(double_value=draw(st.sampled_from([0.0, 1.5, -2.0])))
    if kind == "bytes":
        return AnyValue(bytes_value=b"\x00\x01")
    if kind == "array":
        if depth > 0:
            return AnyValue(string_value="leaf")
        return AnyValue(array_value=ArrayValue(values=draw(st.lists(any_values(depth + 1), max_size=3))))
    if kind == "kvlist":
        return AnyValue(kvlist_value=KeyValueList(values=[KeyValue(key="k", value=AnyValue(string_value="v"))]))
    return AnyValue()


@st.composite
def typed_values(draw, key: str) -> AnyValue:
    """Mostly the type the key is mapped with (so that most messages decode), sometimes any type."""
    kind = KNOWN.get(key)
    if kind is None or draw(st.integers(0, 40)) == 0:
        return draw(any_values())
    if kind == "int":
        return AnyValue(int_value=draw(st.sampled_from([0, 1, 80, 1200, 2**53 - 1])))
    if kind == "strs":
        if draw(st.booleans()):
            return AnyValue(string_value=draw(SHORT_TEXT))
        return AnyValue(array_value=ArrayValue(values=[AnyValue(string_value=draw(SHORT_TEXT))
                                                       for _ in range(draw(st.integers(0, 2)))]))
    return AnyValue(string_value=draw(SHORT_TEXT))


def _ids(draw, size: int, allow_empty: bool) -> bytes:
    choice = draw(st.sampled_from(["ok"] * 40 + ["zero", "short", "empty"]))
    if choice == "zero":
        return bytes(size)
    if choice == "short":
        return b"\x01" * (size - 1)
    if choice == "empty":
        return b""
    return draw(st.binary(min_size=size, max_size=size).filter(any)) if not allow_empty or draw(st.booleans()) else b""


@st.composite
def spans(draw, trace_ids: list[bytes]) -> Span:
    """One span: mapped and content attributes of drawn types, ids sometimes malformed, an exception event."""
    keys = draw(st.lists(st.sampled_from(KEYS), max_size=8))
    attrs = [KeyValue(key=key, value=draw(typed_values(key))) for key in keys]
    start = draw(st.sampled_from([0] + [1_790_000_000_000_000_000] * 15))
    events = []
    if draw(st.booleans()):
        events.append(Span.Event(name=draw(st.sampled_from(["exception", "log"])), attributes=[
            KeyValue(key="exception.type", value=draw(typed_values("error.type"))),
            KeyValue(key="exception.message", value=AnyValue(string_value="a secret"))]))
    return Span(
        trace_id=draw(st.sampled_from(trace_ids)) if draw(st.integers(0, 40)) else _ids(draw, 16, False),
        span_id=_ids(draw, 8, False), parent_span_id=_ids(draw, 8, True),
        name=draw(st.sampled_from(["chat gpt-5", "invoke_agent a", "execute_tool t", "ai.generateText",
                                   "ai.generateText.doGenerate", "ai.toolCall", "LangGraph", ""])),
        start_time_unix_nano=start, end_time_unix_nano=start + draw(st.sampled_from([0, 5_000_000] * 8 + [-1 if start else 0])),
        attributes=attrs, events=events,
        status=Status(code=draw(st.sampled_from([0, 1, 2])),
                      message=draw(st.sampled_from(["", "Max turns exceeded: 3", "boom"]))),
    )


@st.composite
def messages(draw) -> bytes:
    """A TracesData of a few scopes and spans, drawn so that many messages decode and many are refused."""
    trace_ids = [draw(st.binary(min_size=16, max_size=16).filter(any)) for _ in range(2)]
    # (spans per scope kept few: a message is refused at its first bad span, and most should decode)
    scope_spans = [ScopeSpans(scope=InstrumentationScope(name=draw(st.sampled_from(SCOPES)),
                                                         version=draw(st.sampled_from(["", "1.0"]))),
                              spans=draw(st.lists(spans(trace_ids), min_size=1, max_size=3)))
                   for _ in range(draw(st.integers(1, 3)))]
    return TracesData(resource_spans=[ResourceSpans(scope_spans=scope_spans)]).SerializeToString()


def _result(decode, data: bytes):
    try:
        return decode(data)
    except BadTraces as exc:
        return ("refused", exc.reason, str(exc))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(messages())
def test_decode_proto_fast_path_equals_reference(data: bytes) -> None:
    """decode_proto gives the spans (or the refusal) decode_proto_reference gives."""
    assert _result(decode_proto, data) == _result(decode_proto_reference, data)


def test_generated_messages_reach_both_outcomes() -> None:
    """The generator above draws messages that decode and messages that are refused (the test compares both)."""
    seen = set()

    @settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(messages())
    def collect(data: bytes) -> None:
        seen.add("refused" if isinstance(_result(decode_proto_reference, data), tuple) else "decoded")

    collect()
    assert seen == {"refused", "decoded"}


@settings(max_examples=2000, deadline=None)
@given(st.binary(max_size=80))
def test_murmur2_equals_aiokafkas(key: bytes) -> None:
    """assignment.murmur2 (murmurhash2, seeded as Kafka seeds it) is aiokafka's byte-by-byte murmur2 on any key,
    and partition_of picks the partition aiokafka's default partitioner picks."""
    assert murmur2(key) == aiokafka_murmur2(key)
    for n in (1, 4, 6, 8, 12, 64):
        assert partition_of(key, n) == (aiokafka_murmur2(key) & 0x7FFFFFFF) % n


def test_murmur2_on_run_ids_and_known_values() -> None:
    """Run ids as the bridge keys them hash as aiokafka hashes them; Kafka's own test vectors hold."""
    for n in range(200):
        key = f"otel-{n:032x}-{n * 7:016x}".encode()
        assert murmur2(key) == aiokafka_murmur2(key)
    # org.apache.kafka.common.utils.UtilsTest#testMurmur2 (as signed ints there)
    vectors = {b"21": -973932308, b"foobar": -790332482, b"a-little-bit-long-string": -985981536,
               b"a-little-bit-longer-string": -1486304829,
               b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971, b"abc": 479470107}
    for key, signed in vectors.items():
        assert murmur2(key) == signed & 0xFFFFFFFF


def test_router_keeps_hashes_and_still_partitions_as_aiokafka(monkeypatch) -> None:
    """The router's kept hashes give aiokafka's partition for a key met again, and after the store is emptied."""
    monkeypatch.setattr(routing, "HASHES_HELD", 50)
    router = Router(input_partitions=8)
    router.counts = {"agent.steps": 12}
    keys = [f"otel-{n:032x}-{n:016x}".encode() for n in range(120)]
    for _ in range(2):
        for key in keys:
            assert router.partition("agent.steps", key, 3) == (aiokafka_murmur2(key) & 0x7FFFFFFF) % 12
    assert 0 < len(router._hashes) <= 50  # noqa: SLF001 - the bound is the point
