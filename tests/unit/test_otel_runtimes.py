"""Real agent runtimes on their own test models (no model calls): their spans through the bridge and replay."""

from __future__ import annotations

import importlib

import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from loopwarden.codecs import RunStarted
from loopwarden.stages.otel import Limits
from tests.otel.bridge import Bridge, replay
from tests.otel.pydantic_ai_runs import SECRET


@pytest.mark.parametrize("runtime", ["genai_runs", "pydantic_ai_runs", "openai_agents_runs", "langgraph_runs",
                                     "adk_runs"])
def test_runtime_runs_reach_their_states_in_memory(runtime):
    """Each scenario's spans (encoded as the OTLP exporter does, one message per span) give its expected state."""
    scenarios = importlib.import_module(f"tests.otel.{runtime}")
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    expected = scenarios.run(provider)
    b = Bridge()
    b.task = b.new_task(limits=Limits(end_grace_s=2))
    # one message per span, as they ended: the hardest split (a cancelled tool's span ends after its run's)
    b.fold([encode_spans([s]).SerializeToString() for s in exporter.get_finished_spans()])
    b.now_ms += 2000
    b.fold([], punctuate=True)
    assert b.deadletters == []
    events = b.events()
    agents = {e.run_id: e.agent for e in events if isinstance(e, RunStarted)}
    got = {agents[run]: (t.to_state, t.reason) for run, t in replay(events).final.items()}
    assert got == {e.agent: (e.state, e.reason) for e in expected}
    assert all(SECRET.encode() not in o.value for o in b.outputs)


@pytest.mark.parametrize("runtime", ["openai_agents_runs", "langgraph_runs"])
def test_a_hung_run_starts_at_its_first_spans_and_goes_stuck(runtime):
    """A run that hangs (its run span never ends) is published from the spans that ended, and goes STUCK."""
    scenarios = importlib.import_module(f"tests.otel.{runtime}")
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    expected, spans = scenarios.hung(provider, exporter.get_finished_spans)
    b = Bridge()
    b.task = b.new_task(limits=Limits(end_grace_s=2))
    b.fold([encode_spans([s]).SerializeToString() for s in spans])
    b.now_ms += 31_000  # the start grace: no span but the run span names the agent
    b.fold([], punctuate=True)
    events = b.events()
    (started,) = [e for e in events if isinstance(e, RunStarted)]
    assert started.agent == expected.agent
    assert [(t.to_state, t.reason) for t in replay(events, advance_s=400).final.values()] == [
        (expected.state, expected.reason)]
