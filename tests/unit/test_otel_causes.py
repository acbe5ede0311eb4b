"""The bridge's reading of runs the spans tell only partly: cut-short model calls, lost steps, limits raised before
tools ran, handoffs, timeouts beside cancellations, and runs whose run span has not ended (hand-made spans)."""

from __future__ import annotations

from loopwarden.codecs import RunEnded, RunStarted, StepFinished
from loopwarden.stages.otel import Limits
from tests.otel.bridge import Bridge, replay
from tests.otel.traces import Run, ai_sdk_7_run, span, span_id, trace_id, traces

OPENAI = "opentelemetry.instrumentation.openai_agents"
LANGCHAIN = "openinference.instrumentation.langchain"


def states(b: Bridge, advance_s: float = 0.0) -> list[tuple[str, str]]:
    return [(t.to_state, t.reason) for t in replay(b.events(), advance_s).final.values()]


def ended(b: Bridge) -> RunEnded:
    (e,) = [e for e in b.events() if isinstance(e, RunEnded)]
    return e


def cut_short(r: Run, **kw):
    """A model call ended with no response attribute: no finish reason, usage or response model."""
    s = r.chat(None, **kw)
    for key in ("gen_ai.usage.input_tokens", "gen_ai.usage.output_tokens"):
        for i, kv in enumerate(s.attributes):
            if kv.key == key:
                del s.attributes[i]
                break
    return s


def test_a_model_call_cut_short_is_never_a_natural_finish():
    """A run whose last model call has no response attributes and ended OK: unknown (UNCERTAIN), not VERIFYING."""
    b = Bridge()
    r = Run()
    b.fold([traces(r.chat(), r.tool(), cut_short(r), r.end())])
    assert ended(b).cause == "unknown"
    assert [s for s, _ in states(b)] == ["UNCERTAIN"]


def test_a_model_call_cut_short_by_a_cancellation_is_not_known_to_be_an_abort():
    """The same cut-short call with a CancelledError on it: a timeout cancels the same way, so unknown (UNCERTAIN), named."""
    b2 = Bridge()
    r2 = Run()
    first, call = r2.chat(), r2.tool()
    chat = cut_short(r2)
    ev = chat.events.add(name="exception", time_unix_nano=chat.end_time_unix_nano)
    ev.attributes.add(key="exception.type").value.string_value = "asyncio.exceptions.CancelledError"
    b2.fold([traces(first, call, chat, r2.end())])
    assert (ended(b2).cause, ended(b2).error_name) == ("unknown", "CancelledError")
    assert [s for s, _ in states(b2)] == ["UNCERTAIN"]


def test_a_timeout_on_the_run_span_beside_an_inner_cancellation_is_a_timeout():
    """The run span's TimeoutError with the CancelledError it caused inside: timeout, STUCK (never unknown)."""
    b = Bridge()
    r = Run()
    chat = r.chat()
    tool = r.tool("slow", exception="asyncio.exceptions.CancelledError")
    b.fold([traces(chat, tool, r.end(error=True, exception="TimeoutError"))])
    assert (ended(b).cause, ended(b).error_name) == ("timeout", "TimeoutError")
    assert states(b) == [("STUCK", "timeout")]


def test_a_step_lost_to_late_spans_makes_the_run_uncertain():
    """A model call arriving after a later step was published: the run ends unknown, its lost step counted."""
    b = Bridge()
    r = Run()
    c0, c1, c2 = r.chat(), r.chat(), r.chat("stop")
    for group in ([c1], [c2], [c0], [r.end()]):
        b.fold([traces(*group)])
    assert [e.step for e in b.events() if isinstance(e, StepFinished)] == [0, 1]
    assert (ended(b).cause, ended(b).step_count) == ("unknown", 3)
    assert [s for s, _ in states(b)] == ["UNCERTAIN"]
    assert b.counts["otel", "span_late"] == 1


def test_a_tool_call_lost_to_late_spans_makes_the_run_uncertain():
    """A tool call arriving after its step was published (without it): the run ends unknown, never a verdict."""
    b = Bridge()
    r = Run()
    c0, t0, c1, c2 = r.chat(), r.tool(), r.chat(), r.chat("stop")
    for group in ([c0], [c1], [c2], [t0], [r.end()]):
        b.fold([traces(*group)])
    assert ended(b).cause == "unknown" and [s for s, _ in states(b)] == ["UNCERTAIN"]


def test_the_run_spans_timeout_beats_an_inner_cancellation():
    """TimeoutError on the run span and CancelledError on the tool it cut short: timeout, STUCK."""
    b = Bridge()
    r = Run()
    b.fold([traces(r.chat(), r.tool(exception="asyncio.exceptions.CancelledError"),
                   r.end(error=True, exception="TimeoutError"))])
    assert (ended(b).cause, ended(b).error_name) == ("timeout", "TimeoutError")
    assert states(b) == [("STUCK", "timeout")]


def test_a_bound_raised_before_the_requested_tools_ran_is_borne_out_by_the_steps():
    """UsageLimitExceeded after a model call asked for tools that never ran: BOUNDED_STOP, not cause_mismatch."""
    b = Bridge()
    r = Run()
    b.fold([traces(r.chat(), r.tool(), r.chat("tool_call"),
                   r.end(error=True, exception="pydantic_ai.exceptions.UsageLimitExceeded"))])
    last = [e for e in b.events() if isinstance(e, StepFinished)][-1]
    assert [(c.name, c.status) for c in last.tool_calls] == [("unknown", "cancelled")]
    assert states(b) == [("BOUNDED_STOP", "stop_condition")]


def test_a_bound_raised_after_a_final_answer_is_not_given_tool_calls():
    """A bound raised after a model call that finished with `stop` (no tools asked): the step stays without calls."""
    b = Bridge()
    r = Run()
    b.fold([traces(r.chat(), r.tool(), r.chat("stop"),
                   r.end(error=True, exception="pydantic_ai.exceptions.UsageLimitExceeded"))])
    last = [e for e in b.events() if isinstance(e, StepFinished)][-1]
    assert last.tool_calls == () and last.finish_reason == "stop"


def _openai_run(tid: bytes, agent: str, turns: list[list]) -> tuple[bytes, list]:
    """OpenAI Agents' shape: invoke_agent > turn (`unknown`) > chat, execute_tool / agent_handoff."""
    run = span_id()
    out, t = [], 0
    for calls in turns:
        turn = span_id()
        kids = []
        for op, attrs in calls:
            kids.append(span(tid, op, t + 1, t + 5, parent=turn, gen_ai__operation__name=op,
                             gen_ai__agent__name="OpenAI Agent", **attrs))
            t += 5
        out += kids + [span(tid, "unknown", t - 5 * len(kids), t + 1,
                            sid=turn, parent=run, gen_ai__operation__name="unknown", gen_ai__agent__name="OpenAI Agent")]
        t += 1
    return run, out


def test_an_openai_agents_run_starts_before_its_run_span_and_goes_stuck():
    """A hung OpenAI Agents run (its agent span never ends) starts at its first finished turn and goes STUCK."""
    b = Bridge()
    b.task = b.new_task(limits=Limits(end_grace_s=0, start_grace_s=0))
    tid = trace_id()
    chat = ("chat", {"gen_ai__response__finish_reasons": ["tool_calls"], "gen_ai__usage__input_tokens": 3})
    tool = ("execute_tool", {"gen_ai__tool__name": "lookup"})
    run, spans = _openai_run(tid, "oa", [[chat, tool]])
    b.now_ms = 1_790_000_001_000
    b.fold([traces(*spans, scope=OPENAI)])
    b.fold([], punctuate=True)
    (started,) = [e for e in b.events() if isinstance(e, RunStarted)]
    assert started.run_id == f"otel-{tid.hex()}-{run.hex()}"
    assert started.agent == "openai-agents"  # "OpenAI Agent" on every span is not the agent's name
    assert states(b, advance_s=10_000) == [("STUCK", "no_progress")]


def test_an_openai_agents_handoff_ends_the_handing_off_run_as_a_handoff():
    """An agent_handoff span in the last turn: stop_condition custom:handoff (a completion), VERIFYING."""
    b = Bridge()
    tid = trace_id()
    chat = ("chat", {"gen_ai__response__finish_reasons": ["tool_calls"], "gen_ai__usage__input_tokens": 3})
    handoff = ("agent_handoff", {"gen_ai__handoff__to_agent": "other"})
    run, spans = _openai_run(tid, "oa", [[chat, handoff]])
    end = span(tid, "invoke_agent oa", 0, 100, sid=run, gen_ai__operation__name="invoke_agent",
               gen_ai__agent__name="oa")
    b.fold([traces(*spans, end, scope=OPENAI)])
    assert (ended(b).cause, ended(b).fired) == ("stop_condition", ("custom:handoff",))
    assert states(b) == [("VERIFYING", "stop_condition")]


def test_a_langgraph_run_starts_at_its_first_finished_node_and_goes_stuck():
    """A hung LangGraph run (its graph span never ends) starts when its first node's span arrives."""
    b = Bridge()
    b.task = b.new_task(limits=Limits(end_grace_s=0, start_grace_s=0))
    tid, graph, node = trace_id(), span_id(), span_id()
    meta = '{"ls_integration": "langgraph", "langgraph_node": "agent", "langgraph_step": 1}'
    llm = span(tid, "FakeModel", 2, 5, parent=node, openinference__span__kind="LLM", llm__finish_reason="tool_calls",
               metadata=meta)
    node_span = span(tid, "agent", 1, 6, sid=node, parent=graph, openinference__span__kind="CHAIN", metadata=meta)
    b.now_ms = 1_790_000_001_000
    b.fold([traces(llm, node_span, scope=LANGCHAIN)])
    b.fold([], punctuate=True)
    (started,) = [e for e in b.events() if isinstance(e, RunStarted)]
    assert started.run_id == f"otel-{tid.hex()}-{graph.hex()}"
    assert states(b, advance_s=10_000) == [("STUCK", "no_progress")]


def test_ai_sdk_7_under_a_tracer_of_another_name_is_read_as_ai_sdk_7():
    """AI SDK 7 spans from a tracer not named gen_ai, one per message (a chat before its step wrapper): one run."""
    tid, root, (chat1, tool1, step1, chat2, step2, run) = ai_sdk_7_run()
    b = Bridge()
    for s in (chat1, tool1, step1, chat2, step2, run):
        b.fold([traces(s, scope="my-app-tracer")])
    events = b.events()
    assert {e.run_id for e in events} == {f"otel-{tid.hex()}-{root.hex()}"}
    assert [e.agent for e in events if isinstance(e, RunStarted)] == ["weather"]
    steps = [e for e in events if isinstance(e, StepFinished)]
    assert [[c.name for c in s.tool_calls] for s in steps] == [["lookup"], []]
    assert states(b) == [("VERIFYING", "natural_finish")]
