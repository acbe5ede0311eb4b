"""Agent runtimes' real OTLP exports through the real OpenTelemetry Collector into Kafka, then the bridge."""

from __future__ import annotations

import asyncio
import importlib
import json
import subprocess
import uuid
from collections import Counter

import pytest

from loopwarden.stages.otel import decode_traces
from tests.otel.bridge import final_by_agent, replay
from tests.integration.harness import create_topic
from tests.otel.collector import Collector, bridge_partitions, read_spans
from tests.conftest import REPO
from tests.e2e.test_ai_sdk_agents import _node
from tests.otel.pydantic_ai_runs import SECRET, Expected


@pytest.fixture(params=["otlp_proto"])
def collector(kafka, tmp_path, request):
    """A Collector of its own writing to a fresh 3-partition otlp_spans topic on the session broker."""
    topic = f"otlp_spans-{uuid.uuid4().hex[:8]}"
    asyncio.run(create_topic(kafka.bootstrap, topic, 3))
    c = Collector(tmp_path, kafka.bootstrap, topic, encoding=request.param).start()
    c.topic = topic
    yield c
    c.stop()


def _provider(collector: Collector, transport: str):
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    if transport == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
        exporter = OTLPSpanExporter(endpoint=collector.grpc_endpoint)
    else:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        exporter = OTLPSpanExporter(endpoint=collector.endpoint)
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=200))
    return provider


def _check(records, expected, secret: str) -> Counter:
    """One trace per message keyed by its trace id; every run at its expected state; no secret on Kafka."""
    for rec in records:
        trace_ids = {s.trace_id for s in decode_traces(rec.value)}
        assert trace_ids == {rec.key.decode()}, "partition_traces_by_id: one trace per message, key = trace id"
    # the runtime exports its content (prompts, tool arguments, results); the deployed config's processors strip it
    assert not any(secret.encode() in rec.value for rec in records)
    events, produced, _outputs = bridge_partitions(records)
    assert produced and secret.encode() not in produced
    got = final_by_agent(events)
    assert got == {e.agent: (e.state, e.reason) for e in expected}
    return Counter(got.values())


@pytest.mark.parametrize("runtime", ["genai_runs", "pydantic_ai_runs", "openai_agents_runs", "langgraph_runs",
                                     "adk_runs"])
def test_runtime_through_the_collector(kafka, collector, runtime):
    """A runtime's runs exported over OTLP/HTTP to the real Collector reach Kafka and their expected states."""
    _through(kafka, collector, runtime)


def test_runtime_over_grpc_through_the_collector(kafka, collector):
    """Pydantic AI's runs exported over OTLP/gRPC to the real Collector reach the same states as over HTTP."""
    _through(kafka, collector, "pydantic_ai_runs", transport="grpc")


@pytest.mark.parametrize("collector", ["otlp_json"], indirect=True)
def test_otlp_json_through_the_collector(kafka, collector):
    """With the exporter's otlp_json encoding the same runs reach the same states."""
    assert all(r.value.startswith(b"{") for r in _through(kafka, collector, "genai_runs"))


def test_bridge_events_through_the_worker(kafka, collector, tmp_path):
    """The bridge's events for Pydantic AI runs, published on agent.steps, bring the real worker to the same states."""
    from tests.integration.harness import final_states, make_worker, publish, read_topic, run, transitions, unique_config

    records = _through(kafka, collector, "pydantic_ai_runs")
    events, _produced, outputs = bridge_partitions(records)
    expected = {run_id: t.to_state for run_id, t in replay(events).final.items()}
    worker = make_worker(unique_config(kafka.bootstrap, clock="event"), tmp_path).start()
    try:  # the bridge's own records: its keys, bytes and headers, on the default partitioner
        run(publish(worker.config, [("steps", o.key, o.value, list(o.headers)) for o in outputs]))

        def done(recs):
            return final_states(transitions(recs)) == expected

        got = final_states(transitions(run(read_topic(worker.config, worker.config.health_topic, done, 120))))
        assert got == expected, worker.log_tail()
    finally:
        worker.stop()


def _through(kafka, collector, runtime: str, transport: str = "http") -> list:
    scenarios = importlib.import_module(f"tests.otel.{runtime}")
    provider = _provider(collector, transport)
    expected = scenarios.run(provider)
    provider.force_flush()
    provider.shutdown()
    records = asyncio.run(read_spans(kafka.bootstrap, collector.topic, len(expected)))
    _check(records, expected, SECRET)
    return records


AI_SDK_HARNESS = REPO / "tests" / "otel" / "ai-sdk"


@pytest.mark.parametrize("mode", [[], ["--legacy"], ["--hook"]], ids=["ai-sdk-7-otel", "ai-sdk-legacy-spans", "ai-sdk-hook"])
def test_ai_sdk_through_the_collector(kafka, collector, mode):
    """AI SDK 7 ToolLoopAgents on its mock model via the Collector: @ai-sdk/otel, legacy ai.* spans, hook attributes."""
    node = _node()
    assert (AI_SDK_HARNESS / "node_modules" / "@ai-sdk" / "otel").is_dir(), "run `make node` (npm ci in tests/otel/ai-sdk)"
    cmd = [node, str(AI_SDK_HARNESS / "run.mjs"), "--endpoint", collector.endpoint] + mode
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=AI_SDK_HARNESS)
    assert done.returncode == 0, done.stderr[-3000:]
    expected = [Expected(**json.loads(line)) for line in done.stdout.splitlines() if line.strip()]
    # A hung run's run span never comes: wait for the others' (its first step's spans went out before them).
    ending = sum(1 for e in expected if e.state != "RUNNING")
    records = asyncio.run(read_spans(kafka.bootstrap, collector.topic, ending))
    _check(records, expected, SECRET)


def test_deployed_config_is_what_the_bridge_needs():
    """deploy/otel-collector.yaml, as users copy it, is valid for the built Collector and sets what the bridge relies on."""
    import yaml

    from tests.otel.collector import DEPLOYED, OTELCOL

    env = {"KAFKA_BROKERS": "kafka-1:9092", "PATH": "/usr/bin:/bin"}
    check = subprocess.run([str(OTELCOL), "validate", "--config", str(DEPLOYED)], env=env, capture_output=True,
                           text=True, timeout=60)
    assert check.returncode == 0, check.stderr
    shown = subprocess.run([str(OTELCOL), "print-config", "--config", str(DEPLOYED)], env=env, capture_output=True,
                           text=True, timeout=60)
    kafka = yaml.safe_load(shown.stdout)["exporters"]["kafka"]
    assert kafka["brokers"] == ["kafka-1:9092"] and kafka["partition_traces_by_id"] is True
    assert kafka["traces"]["topic"] == "otlp_spans" and kafka["traces"]["encoding"] == "otlp_proto"
