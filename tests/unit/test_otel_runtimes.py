"""Real agent runtimes on their own test models (no model calls): their spans through the bridge and replay."""

from __future__ import annotations

import importlib

import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from loopwarden.codecs import RunStarted
from loopwarden.otel import Limits
from tests.otel.bridge import Bridge, replay
from tests.otel.pydantic_ai_runs import SECRET


@pytest.mark.parametrize("runtime", ["genai_runs", "pydantic_ai_runs", "openai_agents_runs", "langgraph_runs"])
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
