"""The producer hook on the real runtimes: the stops their spans cannot tell, with the hook and without."""

from __future__ import annotations

import functools

import pytest

from loopwarden.codecs import RunEnded, RunStarted
from tests.otel import hook_runs
from tests.otel.bridge import compared, final_by_agent, in_memory, one_per_span, replay, through_bridge
from tests.otel.pydantic_ai_runs import SECRET

RUNTIMES = ["pydantic_ai", "openai_agents", "langgraph", "adk"]


@functools.cache
def outcome(runtime: str) -> tuple[list[hook_runs.Case], dict[str, tuple[str, str]], list]:
    """Every scenario of ``runtime`` once, its spans (one message per span, as they ended) through the bridge."""
    provider, exporter = in_memory(hooked=True)
    cases = getattr(hook_runs, f"run_{runtime}")(provider)
    b = through_bridge(one_per_span(exporter.get_finished_spans()))
    assert b.deadletters == []
    return cases, final_by_agent(b.events()), b.outputs


def _expected(cases, suffix: str) -> dict[str, tuple[str, str | None]]:
    return {c.agent: (c.state, c.reason) for c in cases if c.agent.endswith(suffix)}  # "-hook" or "_hook"


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_with_the_hook_cancels_timeouts_approvals_and_quiet_stops_reach_the_runtimes_own_state(runtime):
    """With the hook: cancel BOUNDED_STOP, timeout STUCK, approval WAITING(_UNROUTED), a quiet stop as its role says."""
    cases, got, _ = outcome(runtime)
    expected = _expected(cases, "hook")
    assert compared(got, expected) == expected


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_without_the_hook_what_the_spans_cannot_tell_stays_uncertain(runtime):
    """The same runs without the hook: what the spans show, else UNCERTAIN, never a confident wrong state."""
    cases, got, _ = outcome(runtime)
    expected = _expected(cases, "bare")
    assert compared(got, expected) == expected


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_hooked_runs_publish_no_content(runtime):
    """A secret planted in every prompt, tool argument and result is in none of the bridge's events."""
    _, _, outputs = outcome(runtime)
    assert outputs and all(SECRET.encode() not in o.value for o in outputs)


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_a_run_hung_in_its_first_model_call_goes_stuck_with_the_hook_and_is_unseen_without(runtime):
    """Hooked, the start marker publishes the run at once, named and under its run id, and it goes STUCK; bare,
    none of its model, tool or run spans has ended, so nothing is published."""
    for hooked in (True, False):
        provider, exporter = in_memory(hooked=True)
        agent, spans = hook_runs.hung_first_call(runtime, provider, exporter.get_finished_spans, hooked)
        events = through_bridge(one_per_span(spans), after_ms=0).events()
        if not hooked:
            assert events == []
            continue
        assert [s.attributes.get("loopwarden.marker") for s in spans].count("run_start") == 1
        (started,) = events
        assert isinstance(started, RunStarted)
        assert (started.agent, started.run_id) == (agent, f"hung-{runtime}")
        assert {run: (t.to_state, t.reason) for run, t in replay(events, advance_s=400).final.items()} == {
            started.run_id: ("STUCK", "no_progress")}


def test_a_langgraph_run_marked_at_its_graph_span_keeps_its_row_and_its_segment_starts_with_the_graph():
    """The first-span marker of a named LangGraph scope: one run of the OpenInference row, ending as it did."""
    provider, exporter = in_memory(hooked=True)
    agent = hook_runs.langgraph_named_run(provider)
    spans = exporter.get_finished_spans()
    (graph,) = [s for s in spans if s.name == agent]
    assert [s.parent.span_id for s in spans if s.attributes.get("loopwarden.marker")] == [graph.context.span_id]
    events = through_bridge(one_per_span(spans)).events()
    (started,) = [e for e in events if isinstance(e, RunStarted)]
    (ended,) = [e for e in events if isinstance(e, RunEnded)]
    assert (started.run_id, started.agent, started.ts) == ("lg-named-run", agent, graph.start_time // 1_000_000)
    assert started.policy.version.startswith("otel:openinference.instrumentation.langchain@")
    assert (ended.cause, ended.step_count, ended.segment) == ("natural_finish", 2, started.ts)
    assert final_by_agent(events) == {agent: ("VERIFYING", "natural_finish")}
