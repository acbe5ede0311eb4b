"""The OpenTelemetry bridge's core on hand-made TracesData: order, time, bounds, bad input, no content out."""

from __future__ import annotations

import base64
import json
import random

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loopwarden.codecs import RunEnded, RunStarted, StepFinished
from loopwarden.stages.otel import Limits, decode_traces, run_id_of
from loopwarden.stages.otel.fold import FINISH, decode_trace
from loopwarden.stages.otel.mapping import ROLE_MODEL, ROLE_OTHER, ROLE_RUN, ROLE_TOOL, ROLE_WRAPPER, RUNTIMES, classify
from tests.otel.bridge import Bridge, Rec, replay
from tests.otel.traces import SECRET, Run, ai_sdk_7_run, span, span_id, trace_id, traces


def kinds(events) -> list[str]:
    return [e.__struct_config__.tag for e in events]


def final(events, advance_s: float = 0.0) -> dict[str, tuple[str, str]]:
    r = replay(events, advance_s)
    return {run: (t.to_state, t.reason) for run, t in r.final.items()}


def natural_run(agent: str = "agent") -> tuple[Run, list]:
    r = Run(agent)
    return r, [r.chat("tool_calls"), r.tool("lookup"), r.chat("stop"), r.end()]


def test_natural_run_in_one_message():
    """One message with a whole run: run_started, a step per model call with its tool call, run_ended natural_finish."""
    b = Bridge()
    r, spans = natural_run()
    b.fold([traces(*spans)])
    events = b.events()
    assert kinds(events) == ["run_started", "step_finished", "step_finished", "run_ended"]
    run_id = run_id_of(r.tid.hex(), r.sid.hex())
    assert all(e.run_id == run_id for e in events) and all(o.key == run_id.encode() for o in b.outputs)
    started, s0, s1, ended = events
    assert started.agent == "agent" and started.policy.version == "otel:pydantic-ai@2.68.0"
    assert [c.name for c in started.policy.stop_when] == ["usage_limit"]
    assert (s0.step, s0.finish_reason, [(c.name, c.status) for c in s0.tool_calls]) == (0, "tool-calls", [("lookup", "result")])
    assert (s1.step, s1.finish_reason, s1.tool_calls, s1.usage.input_tokens) == (1, "stop", (), 10)
    assert (ended.cause, ended.step_count) == ("natural_finish", 2)
    assert final(events) == {run_id: ("VERIFYING", "natural_finish")}


def test_split_across_messages_publishes_a_step_when_the_next_begins():
    """Spans one per message, children first: a step goes out when the next model call arrives, the rest at the run span."""
    b = Bridge()
    r, spans = natural_run()
    b.fold([traces(spans[0])])
    assert kinds(b.events()) == ["run_started"]  # the run starts at its first span; step 0 waits for its tools
    b.fold([traces(spans[1])])
    assert kinds(b.events()) == ["run_started"]
    b.fold([traces(spans[2])])
    assert kinds(b.events()) == ["run_started", "step_finished"]
    assert [c.name for c in b.events()[1].tool_calls] == ["lookup"]
    b.fold([traces(spans[3])])
    assert kinds(b.events()) == ["run_started", "step_finished", "step_finished", "run_ended"]
    whole = Bridge()
    whole.fold([traces(*spans)])
    # the same events, but the run started at its first span's start, not at the run span's (unseen then)
    assert b.events()[1:] == whole.events()[1:] and b.events()[0].ts == whole.events()[0].ts + 1


def test_steps_in_start_time_order_whatever_the_arrival_order():
    """A later model call arriving before an earlier one still gives steps in start-time order."""
    b = Bridge()
    r = Run()
    c0, t0, c1, t1, c2 = r.chat(), r.tool("a"), r.chat(), r.tool("b"), r.chat("stop")
    for group in ([c1], [t1], [t0], [c0], [c2], [r.end()]):
        b.fold([traces(*group)])
    steps = [e for e in b.events() if isinstance(e, StepFinished)]
    assert [(s.step, [c.name for c in s.tool_calls]) for s in steps] == [(0, ["a"]), (1, ["b"]), (2, [])]
    assert b.events()[-1].cause == "natural_finish"


def test_model_call_older_than_a_published_step_is_counted():
    """A model call arriving after a later step went out cannot be placed: counted (span_late), not published."""
    b = Bridge()
    r = Run()
    c0, c1, c2 = r.chat(), r.chat(), r.chat("stop")
    for group in ([c1], [c2], [c0], [r.end()]):
        b.fold([traces(*group)])
    assert [e.step for e in b.events() if isinstance(e, StepFinished)] == [0, 1]
    assert b.counts["otel", "span_late"] == 1


def test_many_traces_in_one_message():
    """A message holding several traces folds each into its own runs."""
    b = Bridge()
    runs = [natural_run(f"agent-{i}") for i in range(3)]
    b.fold([traces(*[s for _r, spans in runs for s in spans])])
    by_run = final(b.events())
    assert sorted(by_run) == sorted(run_id_of(r.tid.hex(), r.sid.hex()) for r, _ in runs)
    assert set(by_run.values()) == {("VERIFYING", "natural_finish")}
    assert len(b.store) == 3


def test_messages_not_keyed_by_trace_are_counted():
    """A message without the trace id as key, or holding several traces, folds but is counted (partition_traces_by_id off)."""
    b = Bridge()
    _r, spans = natural_run()
    out = b.task.fold([Rec(traces(*spans), 0, key=None)])
    assert out.counts["otel", "message_not_keyed_by_trace"] == 1 and len(out.outputs) == 4
    r2, spans2 = natural_run()
    out = b.task.fold([Rec(traces(*spans2), 1, key=r2.tid.hex().encode())])
    assert out.counts["otel", "message_not_keyed_by_trace"] == 0


def test_run_span_never_arrives_goes_stuck():
    """Without its run span a run is RUNNING, its spans are activity, and the inactivity timeout makes it STUCK."""
    b = Bridge()
    r = Run()
    b.fold([traces(r.chat(), r.tool())])
    b.fold([traces(r.chat())])
    events = b.events()
    assert kinds(events) == ["run_started", "step_finished"]
    run_id = run_id_of(r.tid.hex(), r.sid.hex())
    assert final(events) == {run_id: ("RUNNING", "started")}
    assert final(events, advance_s=301) == {run_id: ("STUCK", "no_progress")}


def test_run_without_agent_name_starts_after_the_start_grace():
    """A run whose spans do not name its agent starts under its runtime's name once start_grace_s has passed."""
    b = Bridge()
    b.task = b.new_task(limits=Limits(start_grace_s=30))
    r = Run()
    plain = dict(gen_ai__agent__name="")
    b.fold([traces(r.chat(**plain), r.tool(), r.chat(**plain), scope="some-runtime")])
    assert b.outputs == []
    b.now_ms += 29_000
    b.fold([], punctuate=True)
    assert b.outputs == []
    b.task = b.new_task(limits=Limits(start_grace_s=30))  # a restart keeps the deadline (from the store)
    b.now_ms += 1_000
    b.fold([], punctuate=True)
    events = b.events()
    assert kinds(events) == ["run_started", "step_finished"] and events[0].agent == "genai"
    assert final(events, advance_s=301) == {events[0].run_id: ("STUCK", "no_progress")}


def test_end_grace_waits_for_spans_ending_after_the_run_span():
    """With end_grace_s, a tool span ending after its run span still counts in the last step."""
    b = Bridge()
    b.task = b.new_task(limits=Limits(end_grace_s=2))
    r = Run()
    chat, run = r.chat(), None
    cancelled = r.tool("slow", exception="asyncio.exceptions.CancelledError")
    run = r.end()
    b.fold([traces(chat, run)])
    assert kinds(b.events()) == ["run_started"]
    b.fold([traces(cancelled)])
    b.now_ms += 2_000
    b.fold([], punctuate=True)
    events = b.events()
    assert kinds(events) == ["run_started", "step_finished", "run_ended"]
    assert [c.status for c in events[1].tool_calls] == ["cancelled"]
    assert (events[2].cause, events[2].error_name) == ("unknown", "CancelledError")


def test_end_grace_waits_while_a_backlog_drains():
    """A run past its end grace waits while the input is not caught up, and goes out with the next caught-up fold."""
    b = Bridge()
    b.task = b.new_task(limits=Limits(end_grace_s=2))
    r = Run()
    b.fold([traces(r.chat(), r.end())])  # the last model call asked for tools: the run is held
    b.now_ms += 5_000
    out = b.task.fold([], caught_up=False)
    assert out.outputs == []
    b.task.discard()
    b.fold([traces(Run().chat())])  # any caught-up fold, records or not
    assert kinds(b.events()) == ["run_started", "run_started", "step_finished", "run_ended"]


def test_run_ended_cleanly_after_a_natural_finish_is_published_at_once():
    """A run span OK after a model call that finished without asking for tools is not held for the end grace."""
    b = Bridge()
    b.task = b.new_task(limits=Limits(end_grace_s=2))
    _r, spans = natural_run()
    b.fold([traces(*spans)])
    assert kinds(b.events())[-1] == "run_ended" and b.task.closing == {}


def test_run_whose_last_model_call_recorded_no_finish_waits_the_end_grace():
    """A model call without a finish reason may have asked for tools still running: its run is held end_grace_s."""
    b = Bridge()
    b.task = b.new_task(limits=Limits(end_grace_s=2))
    r = Run()
    b.fold([traces(r.chat(None), r.end())])
    assert kinds(b.events()) == ["run_started"]
    b.now_ms += 1_999
    b.fold([], punctuate=True)
    assert kinds(b.events()) == ["run_started"]
    b.now_ms += 1
    b.fold([], punctuate=True)
    assert kinds(b.events()) == ["run_started", "step_finished", "run_ended"]


@pytest.mark.parametrize("end", [dict(error=True), dict(exception="builtins.TimeoutError")],
                         ids=["error", "exception"])
def test_run_span_in_error_or_with_an_exception_waits_the_end_grace(end):
    """A run span in ERROR or recording an exception is held end_grace_s, even after a natural finish."""
    b = Bridge()
    b.task = b.new_task(limits=Limits(end_grace_s=2))
    r = Run()
    b.fold([traces(r.chat("stop"), r.end(**end))])
    assert kinds(b.events()) == ["run_started"]
    b.now_ms += 2_000
    b.fold([], punctuate=True)
    assert kinds(b.events())[-1] == "run_ended"


def test_held_run_goes_out_with_a_fold_of_other_records_once_due():
    """A run past its end grace goes out with the next caught-up fold, whatever else it folds."""
    b = Bridge()
    b.task = b.new_task(limits=Limits(end_grace_s=2))
    r = Run()
    b.fold([traces(r.chat(), r.end())])
    b.now_ms += 2_000
    b.fold([traces(Run().chat("stop"))])
    assert kinds(b.events()) == ["run_started", "run_started", "step_finished", "run_ended"]


def test_traces_past_retention_are_looked_for_at_most_once_per_expiry_interval():
    """Punctuations come every 0.1 s; a trace past retention is dropped at the first one past expire_every_ms."""
    b = Bridge()
    b.task = b.new_task(limits=Limits(trace_retention_s=0.5), expire_every_ms=1000)
    b.fold([traces(Run().chat())])
    b.now_ms += 1000
    b.fold([], punctuate=True)
    assert b.counts["otel", "traces_expired"] == 1
    b.fold([traces(Run().chat())])
    b.now_ms += 600  # past retention, within the expiry interval
    b.fold([], punctuate=True)
    assert b.counts["otel", "traces_expired"] == 1 and b.task.traces == 1
    b.now_ms += 400
    b.fold([], punctuate=True)
    assert b.counts["otel", "traces_expired"] == 2 and b.task.traces == 0


def test_span_of_an_ended_run_is_counted_and_ignored():
    """A span arriving after its run span is counted (span_after_end) and publishes nothing."""
    b = Bridge()
    r, spans = natural_run()
    b.fold([traces(*spans)])
    n = len(b.outputs)
    b.fold([traces(r.tool("late"))])
    assert len(b.outputs) == n
    assert b.counts["otel", "span_after_end"] == 1


def test_redelivered_message_publishes_nothing_twice():
    """The same spans again (at-least-once upstream) are counted as duplicates."""
    b = Bridge()
    _r, spans = natural_run()
    b.fold([traces(*spans[:2])])
    b.fold([traces(*spans[:2]), traces(*spans[2:])])
    assert kinds(b.events()) == ["run_started", "step_finished", "step_finished", "run_ended"]
    assert b.counts["otel", "span_duplicate"] == 2


def test_restart_from_committed_state_is_exactly_once():
    """A batch whose transaction failed is folded again from the committed store: every event once, in order."""
    r, spans = natural_run()
    b = Bridge()
    b.fold([traces(spans[0])])
    b.fold([traces(spans[1]), traces(spans[2])], commit=False)  # the transaction failed
    b.offset -= 2
    b.task = b.new_task()  # a restart: state only from the committed store
    b.fold([traces(spans[1]), traces(spans[2])])
    b.task = b.new_task()
    b.fold([traces(spans[3])])
    once = Bridge()
    once.fold([traces(*spans)])
    assert b.events()[1:] == once.events()[1:] and len(b.events()) == 4


def test_per_trace_state_is_bounded():
    """A trace past max_spans_per_trace keeps its first spans; the rest are counted, not kept."""
    b = Bridge()
    b.task = b.new_task(limits=Limits(max_spans_per_trace=5))
    r = Run()
    b.fold([traces(*[r.tool(f"t{i}") for i in range(8)])])
    state = decode_trace(next(iter(b.store.values())))
    assert len(state.spans) == 5 and state.dropped == 3
    assert b.counts["otel", "span_trace_full"] == 3


def test_a_trace_of_100_000_spans_is_held_and_the_next_counted():
    """The default bound: 100,000 spans of one trace are held, the 100,001st is counted and dropped."""
    b = Bridge()
    tid, parent = trace_id(), span_id()
    many = [span(tid, "step", i, i + 1, parent=parent) for i in range(100_001)]
    b.fold([traces(*many[:60_000]), traces(*many[60_000:])])
    assert len(decode_trace(b.store[tid.hex().encode()]).spans) == 100_000
    assert b.counts["otel", "span_trace_full"] == 1


def test_long_run_keeps_only_its_open_steps():
    """A run of 2,000 steps, one span per message: published steps' spans leave the state; the events are whole."""
    b = Bridge()
    r = Run()
    for _ in range(2000):
        b.fold([traces(r.chat())])
        b.fold([traces(r.tool())])
        assert len(decode_trace(next(iter(b.store.values()))).spans) <= 4
    b.fold([traces(r.chat("stop"), r.end())])
    events = b.events()
    assert [e.step for e in events if isinstance(e, StepFinished)] == list(range(2001))
    assert all(len(e.tool_calls) == 1 for e in events if isinstance(e, StepFinished) and e.step < 2000)
    assert (events[-1].cause, events[-1].step_count) == ("natural_finish", 2001)
    assert len(decode_trace(next(iter(b.store.values()))).spans) == 1  # the run span, for late spans


def test_spans_waiting_for_their_run_are_woken_by_their_ancestor():
    """OpenAI Agents spans wait for their run span (their parents arrive last); its arrival places them all."""
    tid, root, turn = trace_id(), span_id(), span_id()
    scope = "opentelemetry.instrumentation.openai_agents"
    spans = []
    for i in range(50):
        spans.append(span(tid, "chat m", 10 * i + 1, 10 * i + 5, parent=turn, gen_ai__operation__name="chat",
                          gen_ai__response__finish_reasons=["tool_calls" if i < 49 else "stop"]))
        if i < 49:
            spans.append(span(tid, "execute_tool t", 10 * i + 6, 10 * i + 8, parent=turn, gen_ai__tool__name="t",
                              gen_ai__operation__name="execute_tool"))
    b = Bridge()
    for s in spans:
        b.fold([traces(s, scope=scope)])
    assert b.outputs == []
    state = decode_trace(b.store[tid.hex().encode()])
    assert list(state.waiting) == [turn.hex()] and len(state.waiting[turn.hex()]) == 99
    b.fold([traces(span(tid, "unknown", 0, 600, sid=turn, parent=root, gen_ai__operation__name="unknown"),
                   span(tid, "invoke_agent a", 0, 601, sid=root, gen_ai__operation__name="invoke_agent",
                        gen_ai__agent__name="a"), scope=scope)])
    events = b.events()
    assert kinds(events) == ["run_started"] + ["step_finished"] * 50 + ["run_ended"]
    assert final(events) == {events[0].run_id: ("VERIFYING", "natural_finish")}


def test_trace_dropped_after_retention():
    """A trace with no new span for trace_retention_s is dropped at a punctuation, and counted."""
    b = Bridge()
    b.task = b.new_task(limits=Limits(trace_retention_s=60))
    r = Run()
    b.fold([traces(r.chat())])
    done, spans = natural_run()
    b.fold([traces(*spans)])
    b.now_ms += 30_000
    b.fold([], punctuate=True)
    assert len(b.store) == 2
    b.now_ms += 31_000
    out = b.fold([], punctuate=True)
    assert b.store == {} and set(out.changes.values()) == {None}
    assert b.counts["otel", "traces_expired"] == 2 and b.counts["otel", "runs_unended"] == 1
    assert b.task.traces == 0


def _json_traces(data: bytes) -> bytes:
    """The same TracesData as the Collector's otlp_json writes it: OTLP/JSON, ids in hex."""
    from google.protobuf.json_format import MessageToDict
    from opentelemetry.proto.trace.v1.trace_pb2 import TracesData

    doc = MessageToDict(TracesData.FromString(data))
    for rs in doc["resourceSpans"]:
        for ss in rs["scopeSpans"]:
            for sp in ss["spans"]:
                for k in ("traceId", "spanId", "parentSpanId"):
                    if k in sp:
                        sp[k] = base64.b64decode(sp[k]).hex()
    return json.dumps(doc).encode()


def test_otlp_json_gives_the_same_events_as_otlp_proto():
    """otlp_json (hex ids, int64 as strings) decodes to the same spans and events as otlp_proto."""
    _r, spans = natural_run()
    data = traces(*spans)
    assert decode_traces(_json_traces(data)) == decode_traces(data)
    a, b = Bridge(), Bridge()
    a.fold([data])
    b.fold([_json_traces(data)], headers=(("content-type", b"application/json"),))
    assert a.events() == b.events()


def _bad_messages() -> list[tuple[str, bytes]]:
    tid = trace_id()
    return [
        ("not_traces_data", b"\xff\x00 certainly not protobuf"),
        ("not_traces_data", b'{"hello": "world"}'),
        ("not_traces_data", b""),
        ("bad_span_id", traces(span(b"", "x", 0, 1))),
        ("bad_span_id", traces(span(b"\x01" * 15, "x", 0, 1))),
        ("bad_span_id", traces(span(bytes(16), "x", 0, 1))),
        ("bad_span_id", traces(span(tid, "x", 0, 1, sid=b"\x01\x02\x03"))),
        ("bad_span_id", traces(span(tid, "x", 0, 1, parent=b"\x01"))),
        ("bad_attribute", traces(span(tid, "chat m", 0, 1, gen_ai__operation__name="chat",
                                      gen_ai__usage__input_tokens="ten"))),
        ("bad_attribute", traces(span(tid, "chat m", 0, 1, gen_ai__operation__name=7))),
        ("bad_attribute", traces(span(tid, "chat m", 0, 1, gen_ai__response__finish_reasons=[1, 2]))),
        ("bad_attribute", traces(span(tid, "chat m", 0, 1, gen_ai__usage__output_tokens=-5))),
        ("bad_span_time", traces(span(tid, "x", 5, 1))),
        ("bad_span_id", b'{"resourceSpans":[{"scopeSpans":[{"spans":[{"traceId":"zz","spanId":"0102030405060708"}]}]}]}'),
    ]


@pytest.mark.parametrize("reason,data", _bad_messages())
def test_bad_input_is_dead_lettered_with_a_reason(reason, data):
    """Bad input goes to dead letters as a content-free description with a reason; the good message beside it still folds."""
    b = Bridge()
    _r, spans = natural_run()
    out = b.fold([data, traces(*spans)])
    assert [d.reason for d in out.deadletters] == [reason]
    described = json.loads(out.deadletters[0].record.value)
    assert (described["content_free"], described["bytes"], described["reason"]) == (True, len(data), reason)
    assert kinds(b.events()) == ["run_started", "step_finished", "step_finished", "run_ended"]
    assert out.offsets == {"otlp_spans": 2} and out.counts["invalid", "otlp_spans", reason] == 1


def test_error_messages_name_the_value():
    """A dead letter's error names the attribute and the bad value."""
    b = Bridge()
    out = b.fold([traces(span(trace_id(), "chat m", 0, 1, gen_ai__usage__input_tokens="ten"))])
    assert "attribute 'gen_ai.usage.input_tokens' must be an int >= 0, got 'ten'" in out.deadletters[0].error


def test_span_ending_in_the_future_is_dead_lettered():
    """A span ending beyond the bridge's clock + max_future_ms is refused (the worker would refuse its events)."""
    b = Bridge()
    b.now_ms = 1_790_000_000_000  # T0 of the hand-made spans
    r = Run()
    late = span(r.tid, "chat m", 0, 400_000, parent=r.sid, gen_ai__operation__name="chat")
    out = b.fold([traces(late), traces(r.chat())])
    assert [d.reason for d in out.deadletters] == ["ts_in_future"] and "400 s ahead" in out.deadletters[0].error


def test_oversized_message_is_dead_lettered():
    """A message over max_message_bytes is refused before decoding."""
    b = Bridge()
    b.task = b.new_task(max_message_bytes=1000)
    r = Run()
    data = traces(*[r.tool() for _ in range(40)])
    out = b.fold([data])
    assert [d.reason for d in out.deadletters] == ["oversized"] and b.outputs == []


def test_random_bytes_never_crash():
    """Random and truncated messages are dead-lettered or folded, never raised."""
    rnd = random.Random(7)
    _r, spans = natural_run()
    good = traces(*spans)
    b = Bridge()
    values = [good[: rnd.randrange(len(good))] for _ in range(200)] + [rnd.randbytes(rnd.randrange(1, 300))
                                                                         for _ in range(200)]
    out = b.fold(values)
    assert out.consumed == 400 and out.offsets["otlp_spans"] == 400
    assert all(d.reason != "internal_error" for d in out.deadletters)


def test_mutated_messages_never_crash():
    """Bytes flipped anywhere in a real message: dead-lettered with a reason or folded, never an internal error."""
    rnd = random.Random(11)
    r = Run()
    good = traces(r.chat(), r.tool(error=True), r.chat("stop"), r.end(error=True, exception="ValueError"))
    values = []
    for _ in range(2000):
        data = bytearray(good)
        for _ in range(rnd.randint(1, 4)):
            data[rnd.randrange(len(data))] = rnd.randrange(256)
        values.append(bytes(data))
    b = Bridge()
    out = b.fold(values)
    assert out.consumed == 2000 and out.offsets["otlp_spans"] == 2000
    reasons = {d.reason for d in out.deadletters}
    assert "internal_error" not in reasons and {"not_traces_data", "bad_span_time"} <= reasons


def test_no_content_leaves_the_bridge():
    """A secret planted in every content attribute (and exception messages) is in no event, key or state byte."""
    b = Bridge()
    r = Run(agent="agent")
    spans = [r.chat("tool_calls", secret_attr=SECRET, **{"gen_ai__system_instructions": SECRET}),
             r.tool("lookup", error=True, **{"gen_ai__tool__description": SECRET}),
             r.chat("stop"), r.end(**{"custom__payload": [SECRET, SECRET]})]
    data = traces(*spans)
    assert data.count(SECRET.encode()) >= 10
    b.fold([data, _json_traces(data)], headers=())
    emitted = b"".join(o.key + o.value + b"".join(v for _k, v in o.headers) for o in b.outputs)
    emitted += b"".join(k + (v or b"") for k, v in b.store.items())
    assert b.outputs and SECRET.encode() not in emitted
    assert SECRET.encode()[:8] not in emitted


# -- the mapping table --------------------------------------------------------------------
def _row(name: str):
    return next(r for r in RUNTIMES if r.name == name)


@pytest.mark.parametrize("row,span_name,attrs,role", [
    ("genai", "invoke_agent a", {"gen_ai.operation.name": "invoke_agent"}, ROLE_RUN),
    ("genai", "chat m", {"gen_ai.operation.name": "chat"}, ROLE_MODEL),
    ("genai", "generate_content m", {"gen_ai.operation.name": "generate_content"}, ROLE_MODEL),
    ("genai", "text_completion m", {"gen_ai.operation.name": "text_completion"}, ROLE_MODEL),
    ("genai", "execute_tool t", {"gen_ai.operation.name": "execute_tool"}, ROLE_TOOL),
    ("genai", "step 1", {"gen_ai.operation.name": "agent_step"}, ROLE_OTHER),
    ("ai-sdk-7", "step 1", {"gen_ai.operation.name": "agent_step"}, ROLE_WRAPPER),
    ("ai-sdk-7", "chat mock", {"gen_ai.operation.name": "chat"}, ROLE_MODEL),
    ("ai-sdk-6", "ai.generateText", {"ai.operationId": "ai.generateText"}, ROLE_RUN),
    ("ai-sdk-6", "ai.streamText", {"ai.operationId": "ai.streamText"}, ROLE_RUN),
    ("ai-sdk-6", "ai.generateText.doGenerate", {"ai.operationId": "ai.generateText.doGenerate"}, ROLE_MODEL),
    ("ai-sdk-6", "ai.streamText.doStream", {"ai.operationId": "ai.streamText.doStream"}, ROLE_MODEL),
    ("ai-sdk-6", "ai.toolCall", {"ai.operationId": "ai.toolCall"}, ROLE_TOOL),
    ("langgraph-openinference", "my-graph", {"openinference.span.kind": "CHAIN",
                                             "metadata": '{"ls_integration": "langgraph", "thread_id": "t"}'}, ROLE_RUN),
    # a node's own span (named as its node) is a wrapper between the graph and the node's calls
    ("langgraph-openinference", "agent", {"openinference.span.kind": "AGENT", "metadata":
                                          '{"ls_integration": "langgraph", "langgraph_node": "agent"}'}, ROLE_WRAPPER),
    ("langgraph-openinference", "RunnableSequence", {"openinference.span.kind": "CHAIN", "metadata":
                                                     '{"ls_integration": "langgraph", "langgraph_node": "agent"}'},
     ROLE_OTHER),
    ("langgraph-openinference", "agent", {"openinference.span.kind": "AGENT"}, ROLE_OTHER),
    ("langgraph-openinference", "my-graph", {"openinference.span.kind": "CHAIN", "metadata": "not json"}, ROLE_OTHER),
    ("langgraph-openinference", "ChatModel", {"openinference.span.kind": "LLM"}, ROLE_MODEL),
    ("langgraph-openinference", "lookup", {"openinference.span.kind": "TOOL"}, ROLE_TOOL),
    ("langgraph-openinference", "node", {"openinference.span.kind": "CHAIN"}, ROLE_OTHER),
])
def test_mapping_rows_classify_spans(row, span_name, attrs, role):
    """Each runtime row names its run, model-call, step-wrapper and tool spans."""
    assert classify(_row(row), span_name, attrs) == role


@pytest.mark.parametrize("row,exc,bound", [
    ("pydantic-ai", "pydantic_ai.exceptions.UsageLimitExceeded", "usage_limit"),
    ("openai-agents", "agents.exceptions.MaxTurnsExceeded", "max_turns"),
    ("langgraph-openinference", "langgraph.errors.GraphRecursionError", "recursion_limit"),
    ("genai", "pydantic_ai.exceptions.UsageLimitExceeded", None),
    ("ai-sdk-7", "MaxTurnsExceeded", None),
])
def test_only_known_bounds_are_bounds(row, exc, bound):
    """A bound exception counts only under the runtime that raises it."""
    assert _row(row).bound_name(exc) == bound


@pytest.mark.parametrize("raw,mapped", sorted(FINISH.items()) + [("weird", "other")])
def test_finish_reasons_map_to_the_contract(raw, mapped):
    """gen_ai finish reasons map to section 3's values; unknown ones to other."""
    r = Run()
    b = Bridge()
    b.fold([traces(r.chat(raw), r.end())])
    step = next(e for e in b.events() if isinstance(e, StepFinished))
    assert step.finish_reason == (FINISH.get(raw, "other") if raw != "weird" else "other") == mapped


# -- reported causes ----------------------------------------------------------------------------
def _one(spans, scope: str = "pydantic-ai", **kw):
    b = Bridge()
    b.fold([traces(*spans, scope=scope)])
    events = b.events()
    ended = next(e for e in events if isinstance(e, RunEnded))
    (state,) = final(events).values()
    return ended, state


def test_cause_approval_deferral():
    """A Pydantic AI tool span marked ApprovalRequired: approval_required, WAITING_UNROUTED, the call's id."""
    r = Run()
    chat = r.chat()
    call = r.tool("delete", **{"pydantic_ai__tool__deferral__name": "ApprovalRequired", "gen_ai__tool__call__id": "c1"})
    ended, state = _one([chat, call, r.end()])
    assert (ended.cause, ended.approval.approval_id, ended.approval.tool_name) == ("approval_required", "c1", "delete")
    assert state == ("WAITING_UNROUTED", "approval_required")


def test_cause_bound_exception():
    """UsageLimitExceeded on a Pydantic AI run span: stop_condition, custom:usage_limit fired, BOUNDED_STOP."""
    r = Run()
    ended, state = _one([r.chat(), r.tool(), r.end(error=True, exception="pydantic_ai.exceptions.UsageLimitExceeded")])
    assert (ended.cause, ended.fired) == ("stop_condition", ("custom:usage_limit",))
    assert state == ("BOUNDED_STOP", "stop_condition")


def test_bound_exception_of_another_runtime_is_an_error():
    """The same exception under the GenAI row is only an error (no bound known there)."""
    r = Run()
    ended, state = _one([r.chat(), r.tool(), r.end(error=True, exception="UsageLimitExceeded")], scope="other-rt")
    assert ended.cause == "error" and state == ("FAILED", "error")


@pytest.mark.parametrize("exc,cause,state", [
    ("asyncio.exceptions.CancelledError", "unknown", "UNCERTAIN"),
    ("KeyboardInterrupt", "aborted", "BOUNDED_STOP"),
    ("TimeoutError", "timeout", "STUCK"),
    ("ValueError", "error", "FAILED"),
])
def test_cause_from_run_span_exception(exc, cause, state):
    """A timeout is timeout, an interrupt aborted, a CancelledError (a timeout's too) unknown, another error error; each named."""
    r = Run()
    ended, got = _one([r.chat(), r.tool(), r.end(error=True, exception=exc)])
    assert (ended.cause, ended.error_name, got[0]) == (cause, exc.rsplit(".", 1)[-1], state)


def test_cause_tool_error_last():
    """Run span ERROR after a tool span in ERROR: tool_error, FAILED."""
    r = Run()
    ended, state = _one([r.chat(), r.tool(error=True), r.end(error=True, exception="RuntimeError")])
    assert ended.cause == "tool_error" and state == ("FAILED", "tool_error")


def test_cause_not_recorded_is_unknown():
    """A run that ended OK after a step asking for tools (a step cap, say) is unknown: UNCERTAIN."""
    r = Run()
    ended, state = _one([r.chat(), r.tool(), r.chat("tool_calls"), r.tool(), r.end()])
    assert ended.cause == "unknown" and state == ("UNCERTAIN", "cause_not_recorded")


def test_ai_sdk_7_step_wrapper_is_one_step_with_its_model_call():
    """AI SDK 7: `step N` holding `chat` and `execute_tool` is one step; the chat arriving before its wrapper waits."""
    tid, root, (chat1, tool1, step1, chat2, step2, run) = ai_sdk_7_run()
    b = Bridge()
    b.fold([traces(chat1, scope="gen_ai", version="")])
    assert b.outputs == []  # which run it belongs to is not known until its wrapper arrives
    b.fold([traces(tool1, step1, chat2, scope="gen_ai", version="")])
    assert b.outputs == []  # AI SDK 7 names the agent on its run span only: the run waits for it (start grace)
    b.fold([traces(step2, run, scope="gen_ai", version="")])
    events = b.events()
    assert kinds(events) == ["run_started", "step_finished", "step_finished", "run_ended"]
    assert events[0].agent == "weather" and events[0].policy.stop_when == ()
    whole = Bridge()
    whole.fold([traces(chat1, tool1, step1, chat2, step2, run, scope="gen_ai", version="")])
    assert whole.events() == events
    assert [(s.step, s.finish_reason, len(s.tool_calls)) for s in events[1:3]] == [(0, "tool-calls", 1), (1, "stop", 0)]
    assert (events[3].cause, events[3].step_count) == ("natural_finish", 2)


def test_ai_sdk_6_legacy_spans():
    """AI SDK <= 6: ai.generateText is the run, doGenerate the steps, ai.toolCall the tool calls."""
    tid, root = trace_id(), span_id()
    s = [span(tid, "ai.generateText.doGenerate", 1, 5, parent=root, ai__operationId="ai.generateText.doGenerate",
              ai__response__finishReason="tool-calls", ai__usage__promptTokens=3, ai__prompt__messages=SECRET),
         span(tid, "ai.toolCall", 6, 8, parent=root, ai__operationId="ai.toolCall", ai__toolCall__name="lookup",
              ai__toolCall__id="t1", ai__toolCall__args=SECRET),
         span(tid, "ai.generateText.doGenerate", 9, 12, parent=root, ai__operationId="ai.generateText.doGenerate",
              ai__response__finishReason="stop"),
         span(tid, "ai.generateText", 0, 13, sid=root, ai__operationId="ai.generateText")]
    ended, state = _one(s, scope="ai")
    assert ended.cause == "natural_finish" and ended.step_count == 2 and state == ("VERIFYING", "natural_finish")


def test_sub_agent_is_a_run_of_its_own():
    """An invoke_agent span inside another run's span is its own run, with its own steps."""
    tid = trace_id()
    outer = Run("outer", tid=tid)
    c0 = outer.chat()
    inner = Run("inner", tid=tid, start_ms=outer.t)
    inner_spans = [inner.chat("stop")]
    inner_end = span(tid, "invoke_agent inner", inner.start_ms, inner.t + 1, sid=inner.sid, parent=outer.sid,
                     gen_ai__operation__name="invoke_agent", gen_ai__agent__name="inner")
    outer.t = inner.t + 2
    spans = [c0, *inner_spans, inner_end, outer.chat("stop"), outer.end()]
    b = Bridge()
    b.fold([traces(*spans)])
    states = final(b.events())
    assert len(states) == 2 and set(states.values()) == {("VERIFYING", "natural_finish")}
    agents = {e.agent for e in b.events() if isinstance(e, RunStarted)}
    assert agents == {"outer", "inner"}


def test_state_is_msgspec_encoded():
    """The per-trace state round-trips through its changelog encoding."""
    b = Bridge()
    _r, spans = natural_run()
    b.fold([traces(*spans[:2])])
    (raw,) = b.store.values()
    state = decode_trace(raw)
    assert msgspec.msgpack.encode(state) == raw and len(state.spans) == 2


# -- properties -------------------------------------------------------------------------------
@st.composite
def _run_in_end_order(draw):
    """A run's spans in the order they end (children first, the run span last), with their shape drawn."""
    r = Run()
    spans = []
    n = draw(st.integers(1, 6))
    for i in range(n):
        last = i == n - 1
        spans.append(r.chat("stop" if last else "tool_calls"))
        if not last:
            for _ in range(draw(st.integers(0, 3))):
                spans.append(r.tool(error=draw(st.booleans())))
    ending = draw(st.sampled_from([None, "ValueError", "pydantic_ai.exceptions.UsageLimitExceeded"]))
    spans.append(r.end(error=ending is not None, exception=ending))
    return spans


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spans=_run_in_end_order(), cuts=st.lists(st.integers(1, 30), max_size=8), restart=st.booleans())
def test_any_split_into_messages_gives_the_same_events(spans, cuts, restart):
    """However a run's spans are cut into messages (and restarts between them), the events are those of one message."""
    whole = Bridge()
    whole.fold([traces(*spans)])
    b = Bridge()
    at = 0
    for cut in sorted(set(cuts)) + [len(spans)]:
        if cut > at:
            b.fold([traces(*spans[at:cut])])
            if restart:
                b.task = b.new_task()
            at = cut
    events, once = b.events(), whole.events()
    assert kinds(events) == kinds(once) and events[1:] == once[1:]
    assert events[0].run_id == once[0].run_id and events[0].agent == once[0].agent
