"""The producer hook on the real runtimes: the stops their spans cannot tell, with the hook and without."""

from __future__ import annotations

import functools

import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from loopwarden.codecs import RunStarted
from loopwarden.stages.otel import Limits, hook
from tests.otel import hook_runs
from tests.otel.bridge import Bridge, replay
from tests.otel.pydantic_ai_runs import SECRET

RUNTIMES = ["pydantic_ai", "openai_agents", "langgraph", "adk"]


@functools.cache
def outcome(runtime: str) -> tuple[list[hook_runs.Case], dict[str, tuple[str, str]], list]:
    """Every scenario of ``runtime`` once, its spans (one message per span, as they ended) through the bridge."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(hook.RunSpans(SimpleSpanProcessor(exporter)))
    cases = getattr(hook_runs, f"run_{runtime}")(provider)
    b = Bridge()
    b.task = b.new_task(limits=Limits(end_grace_s=2))
    b.fold([encode_spans([s]).SerializeToString() for s in exporter.get_finished_spans()])
    b.now_ms += 2000
    b.fold([], punctuate=True)
    assert b.deadletters == []
    events = b.events()
    agents = {e.run_id: e.agent for e in events if isinstance(e, RunStarted)}
    got = {agents[run]: (t.to_state, t.reason) for run, t in replay(events).final.items()}
    return cases, got, b.outputs


def _expected(cases, suffix: str) -> dict[str, tuple[str, str | None]]:
    return {c.agent: (c.state, c.reason) for c in cases if c.agent.endswith(suffix)}  # "-hook" or "_hook"


def _seen(got, expected) -> dict[str, tuple[str, str | None]]:
    """What the bridge reached, the reason compared only where the expectation names one."""
    return {agent: (got[agent][0], got[agent][1] if reason is not None else None) if agent in got else None
            for agent, (_state, reason) in expected.items()}


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_with_the_hook_cancels_timeouts_approvals_and_quiet_stops_reach_the_runtimes_own_state(runtime):
    """With the hook: cancel BOUNDED_STOP, timeout STUCK, approval WAITING(_UNROUTED), a quiet stop as its role says."""
    cases, got, _ = outcome(runtime)
    expected = _expected(cases, "hook")
    assert _seen(got, expected) == expected


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_without_the_hook_what_the_spans_cannot_tell_stays_uncertain(runtime):
    """The same runs without the hook: what the spans show, else UNCERTAIN, never a confident wrong state."""
    cases, got, _ = outcome(runtime)
    expected = _expected(cases, "bare")
    assert _seen(got, expected) == expected


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_hooked_runs_publish_no_content(runtime):
    """A secret planted in every prompt, tool argument and result is in none of the bridge's events."""
    _, _, outputs = outcome(runtime)
    assert outputs and all(SECRET.encode() not in o.value for o in outputs)


@pytest.mark.parametrize("runtime", ["pydantic_ai", "openai_agents", "adk"])
def test_a_run_hung_in_its_first_model_call_goes_stuck_with_the_hook_and_is_unseen_without(runtime):
    """Hooked, the start marker publishes the run at once, named and under its run id, and it goes STUCK; bare,
    nothing of it has ended, so nothing is published."""
    for hooked in (True, False):
        exporter = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(hook.RunSpans(SimpleSpanProcessor(exporter)))
        agent, spans = hook_runs.hung_first_call(runtime, provider, exporter.get_finished_spans, hooked)
        b = Bridge()
        b.task = b.new_task(limits=Limits(end_grace_s=2))
        b.fold([encode_spans([s]).SerializeToString() for s in spans])
        b.fold([], punctuate=True)
        events = b.events()
        if not hooked:
            assert (spans, events) == ([], [])
            continue
        (started,) = events
        assert isinstance(started, RunStarted)
        assert (started.agent, started.run_id) == (agent, f"hung-{runtime}")
        assert {run: (t.to_state, t.reason) for run, t in replay(events, advance_s=400).final.items()} == {
            started.run_id: ("STUCK", "no_progress")}
