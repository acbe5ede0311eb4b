"""No content on the wire: through the real Collector (deploy/otel-collector.yaml) and `loopwarden worker --otel`,
a secret planted in every content attribute, event, span name, status and resource attribute is in no byte of
otlp_spans, of any topic the worker writes, or of either process's log; bad spans and bad messages included."""

from __future__ import annotations

import asyncio
import time
import uuid

import msgspec
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient

from tests.integration.harness import create_topic, make_worker, read_topic, run, unique_config
from tests.otel.collector import Collector
from tests.otel.traces import T0, Run, traces

pytestmark = pytest.mark.timeout(300)

SECRET = "pl4nted-N0-C0NTENT-7e57"
SCOPE = "acme.agents"  # a runtime with no row of its own: read by the GenAI conventions
TEN_MINUTES_NS = 600 * 10**9
INJECTED = ("injected-by-test", b"1")  # bad messages the test writes to otlp_spans itself, secret and all


def _provider(endpoint: str, memory):
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor

    provider = TracerProvider(resource=Resource.create({"service.name": f"svc-{SECRET}", "deployment.note": SECRET}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint), schedule_delay_millis=200))
    provider.add_span_processor(SimpleSpanProcessor(memory))  # what the runtime exported: the secret is there
    return provider


def _agent_run(provider, agent: str, *, tokens_as_string: bool = False, tool_clock_ahead: bool = False) -> None:
    """invoke_agent > chat (> an HTTP call), execute_tool (> an app's own span, a failing call), chat: content everywhere."""
    from opentelemetry import trace
    from opentelemetry.trace import SpanKind, Status, StatusCode

    tracer = provider.get_tracer(SCOPE, "1.0.0")
    http = provider.get_tracer("opentelemetry.instrumentation.httpx", "0.50b0")
    app = provider.get_tracer("acme.app")
    with tracer.start_as_current_span(f"invoke_agent {agent}", attributes={
            "gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": agent,
            "gen_ai.input.messages": SECRET, "gen_ai.system_instructions": SECRET, "app.user_note": SECRET}) as root:
        with tracer.start_as_current_span("chat model", kind=SpanKind.CLIENT, attributes={
                "gen_ai.operation.name": "chat", "gen_ai.request.model": f"m-{SECRET}",
                "gen_ai.input.messages": SECRET, "gen_ai.output.messages": SECRET,
                "gen_ai.response.finish_reasons": ["tool_calls"], "gen_ai.usage.output_tokens": 20,
                "gen_ai.usage.input_tokens": "12" if tokens_as_string else 12,
                "metadata": msgspec.json.encode({"ls_integration": "none", "user_note": SECRET}).decode()}) as chat:
            chat.add_event(f"gen_ai.content.prompt {SECRET}", {"gen_ai.prompt": SECRET})
            with http.start_as_current_span(f"POST /v1/{SECRET}", kind=SpanKind.CLIENT,
                                            attributes={"url.full": f"https://llm.example/{SECRET}"}):
                pass
        start = time.time_ns() + (TEN_MINUTES_NS if tool_clock_ahead else 0)
        tool = tracer.start_span(f"execute_tool {agent}-lookup", start_time=start, attributes={
            "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "lookup", "gen_ai.tool.call.id": "call-1",
            "gen_ai.tool.call.arguments": SECRET, "gen_ai.tool.call.result": SECRET})
        with trace.use_span(tool, end_on_exit=False):
            with app.start_as_current_span(f"summarize {SECRET}", attributes={"app.text": SECRET}) as inner:
                inner.record_exception(RuntimeError(f"inner failure {SECRET}"))
                inner.set_status(Status(StatusCode.ERROR, f"inner failure {SECRET}"))
        tool.end(end_time=start + 5_000_000)
        with tracer.start_as_current_span("chat model", kind=SpanKind.CLIENT, attributes={
                "gen_ai.operation.name": "chat", "gen_ai.output.messages": SECRET,
                "gen_ai.response.finish_reasons": ["stop"], "gen_ai.usage.input_tokens": 30}):
            pass
        root.add_event("agent.note", {"text": SECRET})


async def _records(bootstrap: str, topics: list[str]) -> list:
    """Every record of ``topics`` now (read_uncommitted: aborted transactions' bytes count too)."""
    consumer = AIOKafkaConsumer(*topics, bootstrap_servers=bootstrap, auto_offset_reset="earliest",
                                enable_auto_commit=False, group_id=None)
    await consumer.start()
    try:
        await asyncio.sleep(0)
        parts = set()
        while len(parts) == 0:
            parts = consumer.assignment()
            await asyncio.sleep(0.1)
        ends = await consumer.end_offsets(list(parts))
        records: list = []
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            behind = [tp for tp, end in ends.items() if await consumer.position(tp) < end]
            if not behind:
                return records
            for recs in (await consumer.getmany(timeout_ms=300)).values():
                records += recs
        raise TimeoutError(f"{topics} not read to their end in 30 s")
    finally:
        await consumer.stop()


async def _topics_of(bootstrap: str, tag: str) -> list[str]:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        return [t for t in await admin.list_topics() if tag in t]
    finally:
        await admin.close()


async def _inject(bootstrap: str, topic: str, messages: list[tuple[bytes, bytes]]) -> None:
    async with AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all") as producer:
        for key, value in messages:
            await producer.send_and_wait(topic, value, key=key, headers=[INJECTED])


def _bytes(rec) -> bytes:
    return (rec.key or b"") + (rec.value or b"") + b"".join(k.encode() + (v or b"") for k, v in rec.headers or ())


def test_no_planted_secret_reaches_kafka_or_the_logs_through_the_collector(kafka, tmp_path):
    """The secret is exported by the runtime, yet absent from otlp_spans, every topic and log; runs reach their states."""
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    config = unique_config(kafka.bootstrap, partitions=2, otel_topic=f"otlp_spans-{uuid.uuid4().hex[:8]}",
                           otel_partitions=2)
    tag = config.app_id.removeprefix("lw-")  # in every topic name the worker and its bridge use
    asyncio.run(create_topic(kafka.bootstrap, config.otel_topic, 2))
    collector = Collector(tmp_path, kafka.bootstrap, config.otel_topic).start()
    worker = make_worker(config, tmp_path, "w")
    worker.args = ("--otel",)
    try:
        worker.start()
        memory = InMemorySpanExporter()
        provider = _provider(collector.endpoint, memory)
        _agent_run(provider, "natural")
        _agent_run(provider, "tokens-as-string", tokens_as_string=True)
        _agent_run(provider, "tool-host-ahead", tool_clock_ahead=True)
        provider.force_flush()
        provider.shutdown()
        exported = [s for s in memory.get_finished_spans()]
        assert len(exported) == 3 * 6 and SECRET in repr([s.to_json() for s in exported])
        # bad messages in the mix, as a Collector without the filter or a stray producer would write them
        bad_run = Run("unfiltered", start_ms=int(time.time() * 1000) - T0 // 1_000_000 - 5_000)
        bad_chat = bad_run.chat("stop", gen_ai__usage__input_tokens="ten", gen_ai__input__messages=SECRET)
        asyncio.run(_inject(kafka.bootstrap, config.otel_topic, [
            (bad_run.tid.hex().encode(), traces(bad_chat, bad_run.end(custom=SECRET))),
            (b"0" * 32, b"\x0a\xff\xff not protobuf " + SECRET.encode()),
        ]))

        expected = {"natural": ("VERIFYING", "natural_finish"),
                    "tokens-as-string": ("UNCERTAIN", "producer_dropped"),
                    "tool-host-ahead": ("UNCERTAIN", "producer_dropped"),
                    "unfiltered": ("UNCERTAIN", "producer_dropped")}
        agents: dict[str, str] = {}

        def final(records) -> dict:
            for r in records:
                e = msgspec.json.decode(r.value)
                if e.get("type") == "run_started":
                    agents[e["run_id"]] = e["agent"]
            return agents

        run(read_topic(config, config.steps_topic, lambda recs: len(final(recs)) == 4, timeout_s=90))

        def states(records) -> dict:
            got = {}
            for r in records:
                t = msgspec.json.decode(r.value)
                got[agents.get(t["run_id"], t["run_id"])] = (t["to_state"], t["reason"])
            return got

        health = run(read_topic(config, config.health_topic, lambda recs: states(recs) == expected, timeout_s=90))
        assert states(health) == expected, worker.log_tail()

        dead = run(read_topic(config, config.deadletter_topic, lambda recs: len(recs) >= 4, timeout_s=30))
        reasons = sorted(dict(r.headers)["error_reason"].decode() for r in dead)
        assert reasons == ["bad_attribute", "bad_attribute", "not_traces_data", "ts_in_future"]
        assert all(msgspec.json.decode(r.value)["content_free"] for r in dead)

        spans = asyncio.run(_records(kafka.bootstrap, [config.otel_topic]))
        from_collector = [r for r in spans if INJECTED not in [(k, v) for k, v in r.headers or ()]]
        assert len(from_collector) >= 3 and not any(SECRET.encode() in _bytes(r) for r in from_collector)
        topics = asyncio.run(_topics_of(kafka.bootstrap, tag))
        assert {config.steps_topic, config.health_topic, config.deadletter_topic,
                f"{config.app_id}-otel-traces-changelog"} <= set(topics)
        written = asyncio.run(_records(kafka.bootstrap, [t for t in topics if t != config.otel_topic]))
        assert written and not [r.topic for r in written if SECRET.encode() in _bytes(r)]
    finally:
        worker.stop()
        collector.stop()
    logs = worker.log_path.read_bytes() + collector.log_path.read_bytes()
    assert b"dead-lettered" in logs and SECRET.encode() not in logs
