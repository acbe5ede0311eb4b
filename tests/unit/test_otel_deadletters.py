"""A bad span costs that span, never its trace; a bad otlp_spans message is dead-lettered without its content."""

from __future__ import annotations

import json

import pytest

from loopwarden.codecs import EventsDropped, RunStarted
from loopwarden.stages.otel import run_id_of
from loopwarden.engine.outputs import deadletter_output
from tests.otel.bridge import Bridge, Rec, replay
from tests.otel.traces import SECRET, T0, Run, span, trace_id, traces
from tests.unit.test_otel_bridge import _json_traces

T0_MS = T0 // 1_000_000
TEN_MINUTES_MS = 600_000


def _final(events) -> dict[str, tuple[str, str]]:
    return {run: (t.to_state, t.reason) for run, t in replay(events).final.items()}


def _two_runs(bad_a) -> tuple[bytes, str, str]:
    """One trace holding two runs, A and B: ``bad_a(run)`` makes run A's spans (one of them bad), B is sound."""
    tid = trace_id()
    a, b = Run("agent-a", tid=tid), Run("agent-b", tid=tid, start_ms=100)
    spans = bad_a(a) + [b.chat("tool_calls"), b.tool("lookup"), b.chat("stop"), b.end()]
    return traces(*spans), run_id_of(tid.hex(), a.sid.hex()), run_id_of(tid.hex(), b.sid.hex())


def _string_token_count(a: Run) -> list:
    return [a.chat("tool_calls"), a.tool("lookup"), a.chat("stop", gen_ai__usage__input_tokens="12"), a.end()]


def _clock_ahead(a: Run) -> list:
    # the tool ran on a host whose clock is 10 minutes ahead
    tool = a.tool("lookup")
    tool.start_time_unix_nano += TEN_MINUTES_MS * 1_000_000
    tool.end_time_unix_nano += TEN_MINUTES_MS * 1_000_000
    return [a.chat("tool_calls"), tool, a.chat("stop"), a.end()]


def _all_ahead(a: Run) -> list:
    # every span of run A, its run span too, from a host 10 minutes ahead
    spans = [a.chat("tool_calls"), a.tool("lookup"), a.chat("stop"), a.end()]
    for s in spans:
        s.start_time_unix_nano += TEN_MINUTES_MS * 1_000_000
        s.end_time_unix_nano += TEN_MINUTES_MS * 1_000_000
    return spans


@pytest.mark.parametrize("bad_a,reason,refused", [
    (_string_token_count, "bad_attribute", 1),
    (_clock_ahead, "ts_in_future", 1),
    (_all_ahead, "ts_in_future", 4),
], ids=["token-count-as-string", "tool-host-clock-10-min-ahead", "run-host-clock-10-min-ahead"])
def test_a_bad_span_costs_that_span_and_makes_its_run_uncertain_not_the_trace(bad_a, reason, refused):
    """A refused span is counted and its run goes UNCERTAIN (producer_dropped); the trace's other run is judged as usual."""
    data, run_a, run_b = _two_runs(bad_a)
    b = Bridge()
    b.now_ms = T0_MS + 60_000  # the bridge's clock: a minute after the runs
    out = b.fold([data])
    assert out.counts["otel", "span_refused"] == refused and out.counts["invalid", "otlp_spans", reason] == 1
    assert [d.reason for d in out.deadletters] == [reason]
    events = b.events()
    dropped = [e for e in events if isinstance(e, EventsDropped)]
    assert [(e.run_id, e.count) for e in dropped] == [(run_a, refused)]
    started = [e.run_id for e in events if isinstance(e, RunStarted)]
    assert started.index(run_a) < events.index(dropped[0])  # reported on a run the worker knows
    assert _final(events) == {run_a: ("UNCERTAIN", "producer_dropped"), run_b: ("VERIFYING", "natural_finish")}


def test_a_refused_span_is_reported_once_across_messages_and_restarts():
    """A refused model call arriving before its run span is reported once, when its run starts, and not again after a restart."""
    tid = trace_id()
    a = Run("agent-a", tid=tid)
    first = [a.chat("tool_calls", gen_ai__usage__output_tokens="7"), a.tool("lookup")]
    b = Bridge()
    b.now_ms = T0_MS + 60_000
    b.fold([traces(*first)])
    b.task = b.new_task()  # a restart from the committed store
    b.fold([traces(a.chat("stop"), a.end())])
    dropped = [e for e in b.events() if isinstance(e, EventsDropped)]
    assert [e.count for e in dropped] == [1]
    assert _final(b.events()) == {run_id_of(tid.hex(), a.sid.hex()): ("UNCERTAIN", "producer_dropped")}


def _content_everywhere(tid: bytes) -> list:
    """A run whose every content attribute, exception message and span event holds the secret; one bad span."""
    r = Run("agent-a", tid=tid)
    chat = r.chat("tool_calls", gen_ai__system_instructions=SECRET, gen_ai__usage__input_tokens="12")
    chat.events.add(name=f"gen_ai.content.prompt {SECRET}").attributes.add(key="gen_ai.prompt").value.string_value = SECRET
    return [chat, r.tool("lookup", exception="RuntimeError"), r.chat("stop"), r.end(custom__payload=[SECRET, SECRET])]


@pytest.mark.parametrize("encoding", ["otlp_proto", "otlp_json"])
def test_dead_letter_of_a_message_with_a_bad_span_holds_its_shape_and_no_content(encoding):
    """The dead letter keeps ids, structure, attribute keys, mapped values and the error; no content value or name."""
    tid = trace_id()
    data = traces(*_content_everywhere(tid))
    if encoding == "otlp_json":
        data = _json_traces(data)
    assert data.count(SECRET.encode()) >= 8
    b = Bridge()
    b.now_ms = T0_MS + 60_000
    out = b.fold([data])
    (dead,) = out.deadletters
    record = deadletter_output(dead, "agent.deadletter", 3, 1_000_000)
    assert SECRET.encode() not in record.value + b"".join(v for _k, v in record.headers) + (record.key or b"")
    described = json.loads(record.value)
    assert (described["content_free"], described["encoding"], described["refused_spans"]) == (True, encoding, 1)
    assert record.key == tid.hex().encode() or record.key is None
    spans = [s for rs in described["resource_spans"] for ss in rs["scope_spans"] for s in ss["spans"]]
    assert len(spans) == 4 and {s["trace_id"] for s in spans} == {tid.hex()}
    (bad,) = [s for s in spans if "refused" in s]
    assert bad["refused"].startswith("bad_attribute: attribute 'gen_ai.usage.input_tokens' must be an int >= 0, got '12'")
    assert bad["attributes"]["gen_ai.operation.name"] == "chat" and bad["attributes"]["gen_ai.usage.input_tokens"] == "12"
    assert "gen_ai.system_instructions" in bad["attributes"] and bad["attributes"]["gen_ai.system_instructions"] is None
    assert bad["events"] == [{"exception": False, "attributes": {"gen_ai.prompt": None}}]
    tool = next(s for s in spans if s["attributes"].get("gen_ai.operation.name") == "execute_tool")
    assert tool["events"] == [{"exception": True, "attributes": {"exception.type": "RuntimeError",
                                                                  "exception.message": None}}]
    assert "name" not in tool


@pytest.mark.parametrize("data", [b"\x0a\xff\xff" + SECRET.encode() * 3, b'{"resourceSpans": "' + SECRET.encode() + b'"}',
                                  SECRET.encode()])
def test_undecodable_message_is_described_by_size_error_and_key(data):
    """A message that is not TracesData is dead-lettered as its size, error and trace-id key, never its bytes."""
    b = Bridge()
    key = trace_id().hex().encode()
    out = b.task.fold([Rec(data, 0, key=key)])
    (dead,) = out.deadletters
    record = deadletter_output(dead, "agent.deadletter", 3, 1_000_000)
    assert SECRET.encode() not in record.value and record.key == key
    described = json.loads(record.value)
    assert (described["bytes"], described["reason"]) == (len(data), "not_traces_data")
    assert "resource_spans" not in described


def test_a_key_that_is_no_trace_id_is_not_copied():
    """A dead letter keeps its source's key only when it is a trace id (a key could be anything a producer sent)."""
    b = Bridge()
    out = b.task.fold([Rec(b"\xff not protobuf", 0, key=SECRET.encode())])
    assert out.deadletters[0].record.key is None


def test_an_error_quotes_a_mapped_scalar_but_never_a_container():
    """A wrong-typed mapped attribute is quoted when it is a scalar, named only by its type when it is a container."""
    b = Bridge()
    tid = trace_id()
    out = b.fold([traces(span(tid, "chat m", 0, 1, gen_ai__operation__name="chat", gen_ai__agent__name=[SECRET]))])
    (dead,) = out.deadletters
    assert "attribute 'gen_ai.agent.name' must be a string, got a list" in dead.error and SECRET not in dead.error
    assert SECRET.encode() not in dead.record.value
