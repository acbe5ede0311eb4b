"""The producer hook's marks through the real OpenTelemetry Collector and Kafka, then the bridge."""

from __future__ import annotations

import asyncio

import pytest

from loopwarden.stages.otel import hook
from tests.integration.test_otel_collector import collector  # noqa: F401 - the fixture: a Collector of its own
from tests.otel import hook_runs
from tests.otel.bridge import compared, final_by_agent
from tests.otel.collector import bridge_partitions, read_spans
from tests.otel.pydantic_ai_runs import SECRET

pytestmark = pytest.mark.integration


def test_hooked_openai_agents_runs_keep_their_marks_through_the_collector(kafka, collector):  # noqa: F811
    """OpenAI Agents runs exported over OTLP/HTTP through the hook and the Collector reach their states, hooked and bare."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = TracerProvider()
    provider.add_span_processor(hook.RunSpans(BatchSpanProcessor(OTLPSpanExporter(endpoint=collector.endpoint),
                                                                 schedule_delay_millis=200)))
    cases = hook_runs.run_openai_agents(provider)
    provider.force_flush()
    provider.shutdown()
    records = asyncio.run(read_spans(kafka.bootstrap, collector.topic, len(cases)))
    events, produced, _outputs = bridge_partitions(records)
    assert produced and SECRET.encode() not in produced
    expected = {c.agent: (c.state, c.reason) for c in cases}
    assert compared(final_by_agent(events), expected) == expected
