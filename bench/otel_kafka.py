"""Bench o otel on a broker: the bridge and the worker, each on Kafka, on the same traces.

``python -m bench.otel_kafka [--runs N] [--rounds R]`` (also ``python -m bench.run --only otel``)

"The bridge is not the bottleneck of the pair" compares what the bridge produces with
what the worker takes in, both as they run: on Kafka, exactly-once, with their transactions. Per
round, on one local broker (the ingest bench's, ``bench/ingest.py``), rotating the order:

* **bridge** - ``python -m loopwarden.cli bridge`` over a backlog of ``otlp_spans`` (the traces of
  ``bench/otel.py``, one trace per message keyed by trace id, 8 partitions, as the Collector's
  Kafka exporter writes them with ``partition_traces_by_id``), publishing on a fresh steps topic;
* **worker** - ``python -m loopwarden.cli worker`` (event clock, memory store) over a backlog of
  the very events the bridge publishes for those traces, keyed by run id (produced by the bench);
* **pair** - ``python -m loopwarden.cli worker --otel``: both stages in one process, as users run
  them, over a fresh ``otlp_spans`` backlog, until the worker has taken in every event.

Each is a black box read as the ingest bench reads the worker: the group's committed offsets on its
input, sampled every 50 ms, the steady window from 10 % to 90 % of the input, and the process's
CPU (user + system, /proc) over that window. The bridge's window counts messages; its events are
the messages' events (the bench's own in-process fold of the same records says how many each
message owes). The pair's input is the bridge's (messages), its end the worker's last commit.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time
import urllib.request
import uuid
from dataclasses import dataclass
from pathlib import Path

from aiokafka import AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from bench.common import Report, cpu_s, median, progress, si
from bench.ingest import (
    PARTITIONS,
    REPO,
    Backlog,
    Result,
    _env,
    _readyz,
    _tail,
    create_topics,
    crossing,
    run_app,
    spawn,
    start_broker,
    stop,
    stop_all,
    wait_ready,
    warm_up,
)
from bench.otel import _bridge, traces
from dev.localkafka import free_port

BENCH = "o otel"
SAMPLE_S = 0.05
READY_TIMEOUT_S = 120.0
CAP_S = 120.0
PROFILE_DIR = ""  # --profile
BASE_TREE = ""  # --base-tree: the app "bridge-base" runs `loopwarden bridge` from this checkout


@dataclass
class Spans:
    """The otlp_spans backlog: messages, and what they hold and owe."""

    topic: str
    ends: dict[TopicPartition, int]
    messages: int
    spans: int
    events: int
    runs: int


async def _produce(bootstrap: str, topic: str, items: list[tuple[bytes, bytes]]) -> dict[TopicPartition, int]:
    """(key, value) pairs onto ``topic`` (default partitioner), acks=all; returns its end offsets."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=10, max_batch_size=1024 * 1024,
                                max_request_size=8 * 1024 * 1024)
    await producer.start()
    try:
        pending = []
        for key, value in items:
            pending.append(await producer.send(topic, value, key=key))
            if len(pending) >= 2_000:
                await asyncio.gather(*pending)
                pending.clear()
        await asyncio.gather(*pending)
    finally:
        await producer.stop()
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        from aiokafka import AIOKafkaConsumer

        consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False)
        await consumer.start()
        try:
            return await consumer.end_offsets([TopicPartition(topic, p) for p in range(PARTITIONS)])
        finally:
            await consumer.stop()
    finally:
        await admin.close()


async def _spans_backlog(bootstrap: str, records: list, spans: int, events: int) -> Spans:
    topic = f"otlp-{uuid.uuid4().hex[:8]}"
    await create_topics(bootstrap, [topic])
    ends = await _produce(bootstrap, topic, [(r.key, r.value) for r in records])
    if sum(ends.values()) != len(records):
        raise RuntimeError(f"produced {len(records)} messages but {topic}'s end offsets sum to {sum(ends.values())}")
    return Spans(topic, ends, len(records), spans, events, len(records) // 2)  # two messages a run


async def _committed(admin: AIOKafkaAdminClient, group: str, ends: dict[TopicPartition, int]) -> int:
    offsets = await admin.list_consumer_group_offsets(group, partitions=list(ends))
    return sum(min(max(om.offset, 0), ends[tp]) for tp, om in offsets.items() if tp in ends)


def _verifying(port: int) -> float:
    """Transitions to VERIFYING the worker has counted (its /metrics)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
            body = resp.read().decode()
    except OSError:
        return 0.0
    return sum(float(line.rsplit(" ", 1)[1]) for line in body.splitlines()
               if line.startswith("loopwarden_transitions_total{") and 'to_state="VERIFYING"' in line)


async def run_spans_app(app: str, backlog: Spans, bootstrap: str, rdir: Path, cap_s: float) -> Result:
    """``bridge`` (loopwarden bridge) or ``pair`` (loopwarden worker --otel) over the otlp_spans backlog.

    ``events`` and the steady figures count the *events* the consumed messages owe (messages x events
    per message): the bridge's output, the pair's input to its worker. The pair is done when its worker
    has committed every offset of the steps topic the bridge filled."""
    tag = uuid.uuid4().hex[:8]
    group = f"otelbench-{app}-{tag}"
    adir = rdir / f"{app}-{tag}"
    adir.mkdir(parents=True)
    log = adir / "app.log"
    steps, outcomes = f"steps-{tag}", f"outcomes-{tag}"
    port = free_port()
    env = _env({
        "LOOPWARDEN_BROKER": bootstrap, "LOOPWARDEN_APP_ID": group, "LOOPWARDEN_OTEL_TOPIC": backlog.topic,
        "LOOPWARDEN_OTEL_PARTITIONS": str(PARTITIONS), "LOOPWARDEN_STEPS_TOPIC": steps,
        "LOOPWARDEN_OUTCOMES_TOPIC": outcomes, "LOOPWARDEN_HEALTH_TOPIC": f"health-{tag}",
        "LOOPWARDEN_DEADLETTER_TOPIC": f"dead-{tag}", "LOOPWARDEN_TICKS_TOPIC": f"ticks-{tag}",
        "LOOPWARDEN_PARTITIONS": str(PARTITIONS), "LOOPWARDEN_CLOCK": "event", "LOOPWARDEN_WEB_PORT": str(port),
        "LOOPWARDEN_DATA_DIR": str(adir / "data"),
        # The group's offsets with every transaction: this bench reads progress from them, and its backlogs
        # last about a second, as long as the default interval (1 s) between the group's commits.
        "LOOPWARDEN_COMMIT_OFFSETS_MS": "0",
    })
    if app in ("bridge", "bridge-base"):
        await create_topics(bootstrap, [steps, f"dead-{tag}"])  # the bridge wants a worker's topics to exist
        argv = [sys.executable, "-m", "loopwarden.cli", "bridge"]
    else:
        argv = [sys.executable, "-m", "loopwarden.cli", "worker", "--otel"]
    if PROFILE_DIR:  # --profile DIR: the app under cProfile (slower; for a look at where its time goes)
        argv[1:1] = ["-m", "cProfile", "-o", str(Path(PROFILE_DIR) / f"{app}-{tag}.prof")]
    per_message = backlog.events / backlog.messages
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    t_spawn = time.monotonic()
    if app == "bridge-base":  # --base-tree: the same command from another checkout, for a before/after
        argv = [sys.executable, "-c", "import sys, runpy; sys.path.insert(0, sys.argv.pop(1)); "
                "runpy.run_module('loopwarden.cli', run_name='__main__', alter_sys=True)", BASE_TREE, "bridge"]
    proc = spawn(argv, env, log)
    try:
        await wait_ready(app, proc, port, log, t_spawn, READY_TIMEOUT_S)
        t_ready, c_ready = time.monotonic(), cpu_s(proc.pid)
        samples: list[tuple[float, float, float]] = []
        last_look: dict = {}  # the pair's worker's progress, for the error message
        while True:
            done = await _committed(admin, f"{group}-otel", backlog.ends)
            now, c_now = time.monotonic(), cpu_s(proc.pid)
            samples.append((done, now, c_now))
            finished = done >= backlog.messages
            if finished and app == "pair":
                # the bridge is through; its last runs' events follow its end grace (2 s), then the worker's
                # transitions: done when every run has reached VERIFYING (one /metrics read every 0.5 s)
                verifying = _verifying(port)
                last_look = {"runs VERIFYING": verifying, "of": backlog.runs}
                finished = verifying >= backlog.runs
            if finished:
                res = Result(app, int(done * per_message), now - t_ready, c_now - c_ready, t_ready - t_spawn)
                marks = [crossing(samples, backlog.messages * f) for f in (0.1, 0.9)]
                marks = [(n * per_message, t, c) for n, t, c in (m for m in marks if m)]
                res.set_steady(marks)
                return res
            if proc.poll() is not None:
                raise RuntimeError(f"{app} exited with {proc.returncode} at {done} of {backlog.messages}; "
                                   f"{log}:\n{_tail(log)}")
            if now - t_ready > cap_s:
                raise TimeoutError(f"{app} committed {done} of {backlog.messages} messages in {cap_s:.0f}s"
                                   + (f"; its worker: {last_look}" if last_look else "")
                                   + f"; {log}")
            await asyncio.sleep(SAMPLE_S if not finished else 0.5)
    finally:
        await asyncio.shield(admin.close())
        stop(proc)


async def _rounds(bootstrap: str, broker_pid: int, workdir: Path, runs: int, rounds: int, cap_s: float,
                  apps: tuple[str, ...]) -> tuple[dict[str, list[Result]], dict]:
    records, spans = traces(runs, 5, 4)
    _cpu, outputs = _bridge(records)  # the events the bridge owes for these traces, in its own order
    progress(f"[o] {runs:,} runs: {len(records):,} messages, {spans:,} spans, {len(outputs):,} events; preloading ...")
    await warm_up(bootstrap, uuid.uuid4().hex[:8])
    tag = uuid.uuid4().hex[:8]
    events = Backlog(bootstrap, f"events-{tag}", f"outcomes-{tag}", [o.value for o in outputs],
                     {"steps": len(outputs), "outcomes": 0})
    await create_topics(bootstrap, [events.steps, events.outcomes])
    steps_ends = await _produce(bootstrap, events.steps, [(o.key, o.value) for o in outputs])
    events.ends = {**steps_ends, **{TopicPartition(events.outcomes, p): 0 for p in range(PARTITIONS)}}
    results: dict[str, list[Result]] = {a: [] for a in apps}
    shape = {"messages": len(records), "spans": spans, "events": len(outputs)}
    for i in range(rounds):
        order = apps[i % len(apps):] + apps[:i % len(apps)]
        progress(f"[o] round {i + 1}/{rounds}: {', '.join(order)}")
        rdir = workdir / f"round-{i}"
        for app in order:
            if app == "worker":
                res = await run_app("worker", events, rdir, broker_pid, cap_s, {"LOOPWARDEN_COMMIT_OFFSETS_MS": "0"})
            else:
                # a fresh otlp_spans backlog per run: each app's group starts at 0 on its own topic
                backlog = await _spans_backlog(bootstrap, records, spans, len(outputs))
                res = await run_spans_app(app, backlog, bootstrap, rdir, cap_s)
            results[app].append(res)
            progress(f"[o]   {app:<6} steady {si(res.steady_eps, 'ev/s'):>11} {res.steady_cpu_us:6.1f} µs CPU/event"
                     f" {res.steady_s:5.1f} s | ready->done {si(res.eps, 'ev/s'):>11} {res.cpu_us:6.1f} µs CPU/event"
                     f" {res.wall_s:5.1f} s" + (" CAPPED" if res.capped else ""))
    return results, shape


def otel_kafka(report: Report, workdir: Path, runs: int, rounds: int, cap_s: float = 120.0,
               apps: tuple[str, ...] = ("bridge", "worker", "pair")) -> None:
    progress("[o] starting a local Kafka broker (KRaft) ...")
    kafka = start_broker(workdir / "kafka-otel")
    try:
        results, shape = asyncio.run(_rounds(kafka.bootstrap, kafka.pid, workdir / "otel", runs, rounds, cap_s, apps))
    finally:
        stop_all()
        kafka.stop()
    spans_per_event = shape["spans"] / shape["events"]

    def med(app: str, attr: str) -> float:
        return median([getattr(r, attr) for r in results[app]])

    note = f"{shape['messages']:,} messages, {shape['spans']:,} spans, {shape['events']:,} events; median of {rounds}"
    rows = {"bridge": "loopwarden bridge (otlp_spans -> agent.steps)", "bridge-base": "loopwarden bridge, --base-tree",
            "worker": "loopwarden worker (agent.steps)",
            "pair": "loopwarden worker --otel (both, one process)"}
    for app in apps:
        cpu = med(app, "steady_cpu_us")
        per_span = f" ({cpu / spans_per_event:.1f} µs/span)" if app != "worker" else ""
        report.add(BENCH, f"on Kafka: {rows[app]}, steady", f"{si(med(app, 'steady_eps'))} events/s",
                   f"{cpu:.1f} µs CPU/event{per_span}; one core: {si(1e6 / cpu)} events/s; {note}")
    if "bridge" in apps and "worker" in apps:
        b, w = med("bridge", "steady_cpu_us"), med("worker", "steady_cpu_us")
        report.add(BENCH, "on Kafka: bridge events/s : worker events/s, one core each", f"{w / b:.2f}x",
                   "CPU per event, steady windows; target >= 1x")


# -- through the real Collector: its CPU per span beside the bridge's, and span end -> transition latency --------

OTELCOL = REPO / ".tools" / "otelcol"  # `make otelcol`
DEPLOYED = REPO / "deploy" / "otel-collector.yaml"


def _start_collector(bootstrap: str, topic: str, adir: Path) -> tuple[subprocess.Popen, int]:
    """`.tools/otelcol` with deploy/otel-collector.yaml as shipped, but for the broker, topic and ports; returns
    the process and its OTLP/HTTP port once it listens."""
    import socket

    import yaml

    if not OTELCOL.is_file():
        raise RuntimeError(f"{OTELCOL} missing: run `make otelcol` (the Collector is built from its Go modules)")
    config = yaml.safe_load(DEPLOYED.read_text())
    http_port = free_port()
    grpc_port = free_port(exclude=(http_port,))
    config["receivers"]["otlp"]["protocols"]["http"]["endpoint"] = f"127.0.0.1:{http_port}"
    config["receivers"]["otlp"]["protocols"]["grpc"]["endpoint"] = f"127.0.0.1:{grpc_port}"
    config["exporters"]["kafka"]["brokers"] = [bootstrap]
    config["exporters"]["kafka"]["traces"]["topic"] = topic
    config["service"]["telemetry"] = {"metrics": {"level": "none"}}  # no :8888 of its own
    adir.mkdir(parents=True, exist_ok=True)
    path = adir / "otel-collector.yaml"
    path.write_text(yaml.safe_dump(config))
    proc = spawn([str(OTELCOL), "--config", str(path)], _env({}), adir / "otelcol.log")
    deadline = time.monotonic() + READY_TIMEOUT_S
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"otelcol exited with {proc.returncode}:\n{_tail(adir / 'otelcol.log')}")
        try:
            socket.create_connection(("127.0.0.1", http_port), timeout=0.5).close()
            return proc, http_port
        except OSError:
            if time.monotonic() > deadline:
                raise TimeoutError(f"otelcol not listening after {READY_TIMEOUT_S:.0f}s") from None
            time.sleep(0.2)


async def _end_offsets(bootstrap: str, topic: str) -> dict[TopicPartition, int]:
    from aiokafka import AIOKafkaConsumer

    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False)
    await consumer.start()
    try:
        return await consumer.end_offsets([TopicPartition(topic, p) for p in range(PARTITIONS)])
    finally:
        await consumer.stop()


async def collector_cpu(bootstrap: str, records: list, spans: int, events: int, rdir: Path) -> tuple[float, Spans]:
    """The Collector's CPU seconds to take ``records`` in over OTLP/HTTP (64 messages a request, in their order:
    a TracesData is an ExportTraceServiceRequest on the wire) and write them to a fresh ``otlp_spans`` of 8
    partitions; returns them and that topic as a backlog for the bridge. The window ends once the topic's end
    offsets stop moving for a second after the last request (its idle CPU in that second is counted too)."""
    topic = f"otlp-c-{uuid.uuid4().hex[:8]}"
    await create_topics(bootstrap, [topic])
    proc, port = _start_collector(bootstrap, topic, rdir / f"otelcol-{topic}")
    try:
        url = f"http://127.0.0.1:{port}/v1/traces"

        def post(body: bytes) -> None:
            req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/x-protobuf"})
            with urllib.request.urlopen(req, timeout=30) as resp:
                resp.read()

        post(records[0].value)  # its first request (connections, first allocations) is not the steady cost
        await asyncio.sleep(1.0)
        c0 = cpu_s(proc.pid)
        loop = asyncio.get_running_loop()
        for i in range(1, len(records), 64):
            await loop.run_in_executor(None, post, b"".join(r.value for r in records[i:i + 64]))
        last, still = None, time.monotonic()
        while True:
            ends = await _end_offsets(bootstrap, topic)
            if ends != last:
                last, still = ends, time.monotonic()
            elif time.monotonic() - still >= 1.0:
                break
            await asyncio.sleep(0.1)
        cpu = cpu_s(proc.pid) - c0
    finally:
        stop(proc)
    messages = sum(last.values())
    return cpu, Spans(topic, last, messages, spans, events, len(records) // 2)


async def span_latency(bootstrap: str, rdir: Path, runs: int, delay_ms: int, pace_s: float) -> list[float]:
    """Span end -> transition readable, in seconds, per run: ``runs`` runs (invoke_agent, chat asking for a tool,
    execute_tool, chat finishing) ended one every ``pace_s`` by the OpenTelemetry SDK, exported by its
    BatchSpanProcessor every ``delay_ms`` over OTLP/HTTP to the real Collector, into ``loopwarden worker --otel``
    (wall clock, its defaults); measured from the run span's end to a read_committed reader of agent.health
    receiving the run's VERIFYING transition."""
    import threading

    from aiokafka import AIOKafkaConsumer
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    tag = uuid.uuid4().hex[:8]
    adir = rdir / f"latency-{delay_ms}-{tag}"
    adir.mkdir(parents=True)
    otlp, health, port = f"otlp-l-{tag}", f"health-{tag}", free_port()
    env = _env({
        "LOOPWARDEN_BROKER": bootstrap, "LOOPWARDEN_APP_ID": f"otellat-{tag}", "LOOPWARDEN_OTEL_TOPIC": otlp,
        "LOOPWARDEN_STEPS_TOPIC": f"steps-{tag}", "LOOPWARDEN_OUTCOMES_TOPIC": f"outcomes-{tag}",
        "LOOPWARDEN_HEALTH_TOPIC": health, "LOOPWARDEN_DEADLETTER_TOPIC": f"dead-{tag}",
        "LOOPWARDEN_TICKS_TOPIC": f"ticks-{tag}", "LOOPWARDEN_WEB_PORT": str(port),
    })
    worker = spawn([sys.executable, "-m", "loopwarden.cli", "worker", "--otel"], env, adir / "app.log")
    collector = None
    try:
        t0 = time.monotonic()
        while not _readyz(port):  # the worker and its bridge made their topics (otlp_spans with 8 partitions)
            if worker.poll() is not None or time.monotonic() - t0 > READY_TIMEOUT_S:
                raise RuntimeError(f"worker --otel not ready; {adir / 'app.log'}:\n{_tail(adir / 'app.log')}")
            await asyncio.sleep(0.1)
        collector, http_port = _start_collector(bootstrap, otlp, adir)
        ended: dict[str, int] = {}  # run id -> its run span's end (ns, wall)
        arrived: dict[str, int] = {}
        reader = AIOKafkaConsumer(health, bootstrap_servers=bootstrap, group_id=None, isolation_level="read_committed",
                                  auto_offset_reset="earliest", enable_auto_commit=False)
        await reader.start()

        def emit() -> None:
            provider = TracerProvider()
            provider.add_span_processor(BatchSpanProcessor(
                OTLPSpanExporter(endpoint=f"http://127.0.0.1:{http_port}/v1/traces"), schedule_delay_millis=delay_ms))
            tracer = provider.get_tracer("bench", "1")
            agent = {"gen_ai.agent.name": "bench-agent"}
            for _ in range(runs):
                with tracer.start_as_current_span("invoke_agent bench-agent",
                                                  attributes={"gen_ai.operation.name": "invoke_agent", **agent}) as run:
                    for finish, tool in (("tool_calls", True), ("stop", False)):
                        with tracer.start_as_current_span("chat m", attributes={
                                "gen_ai.operation.name": "chat", "gen_ai.response.finish_reasons": [finish], **agent}):
                            time.sleep(0.005)
                        if tool:
                            with tracer.start_as_current_span("execute_tool lookup", attributes={
                                    "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "lookup",
                                    "gen_ai.tool.call.id": "call-1", **agent}):
                                time.sleep(0.002)
                ctx = run.get_span_context()
                ended[f"otel-{ctx.trace_id:032x}-{ctx.span_id:016x}"] = run.end_time
                time.sleep(pace_s)
            provider.shutdown()

        thread = threading.Thread(target=emit, daemon=True)
        thread.start()
        deadline = time.monotonic() + runs * pace_s + 60
        while time.monotonic() < deadline:
            for recs in (await reader.getmany(timeout_ms=100)).values():
                now = time.time_ns()
                for rec in recs:
                    t = json.loads(rec.value)
                    if t.get("to_state") == "VERIFYING":
                        arrived.setdefault(t["run_id"], now)
            if not thread.is_alive() and len(arrived) >= len(ended):
                break
        await reader.stop()
        thread.join(5)
        if len(arrived) < runs:
            raise RuntimeError(f"{len(arrived)} of {runs} runs reached VERIFYING; {adir}")
        return [(arrived[r] - ended[r]) / 1e9 for r in ended]
    finally:
        if collector is not None:
            stop(collector)
        stop(worker)


def _pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def otel_collector(report: Report, workdir: Path, runs: int, latency_runs: int) -> None:
    """The real Collector's rows: its CPU per span beside the bridge's on the same spans (one trace per message
    as its exporter writes them), and span end -> transition with 200 ms and the SDK's default 5 s batching."""
    progress("[o] Collector rows: starting a local Kafka broker (KRaft) ...")
    kafka = start_broker(workdir / "kafka-otelcol")

    async def rounds() -> tuple[float, Result, Spans, dict[int, list[float]]]:
        records, spans = traces(runs, 5, 4)
        _cpu, outputs = _bridge(records)
        await warm_up(kafka.bootstrap, uuid.uuid4().hex[:8])
        progress(f"[o]   the Collector takes {len(records):,} messages ({spans:,} spans) over OTLP/HTTP ...")
        cpu, backlog = await collector_cpu(kafka.bootstrap, records, spans, len(outputs), workdir / "otelcol")
        progress(f"[o]   the bridge over the {backlog.messages:,} messages the Collector wrote ...")
        bridge = await run_spans_app("bridge", backlog, kafka.bootstrap, workdir / "otelcol", CAP_S)
        latencies = {}
        for delay_ms, n, pace in ((200, latency_runs, 0.1), (5000, max(latency_runs // 3, 10), 0.3)):
            progress(f"[o]   span end -> transition, {delay_ms} ms batching, {n} runs ...")
            latencies[delay_ms] = await span_latency(kafka.bootstrap, workdir / "otelcol", n, delay_ms, pace)
        return cpu, bridge, backlog, latencies

    try:
        cpu, bridge, backlog, latencies = asyncio.run(rounds())
    finally:
        stop_all()
        kafka.stop()
    per_event = backlog.spans / backlog.events
    collector_us = cpu / (backlog.spans - 9) * 1e6  # the warm-up request's run (9 spans) is not in the window
    note = f"{backlog.spans:,} spans in {backlog.messages:,} messages as the Collector wrote them"
    report.add(BENCH, "the real Collector (make otelcol, deploy config): OTLP/HTTP in, otlp_spans out",
               f"{collector_us:.1f} µs CPU/span", f"{collector_us * per_event:.1f} µs CPU per event's spans; {note}")
    b = bridge.steady_cpu_us
    report.add(BENCH, "loopwarden bridge over those messages, steady", f"{b / per_event:.1f} µs CPU/span",
               f"{b:.1f} µs CPU/event; {b / per_event / collector_us:.2f}x the Collector per span")
    for delay_ms, values in latencies.items():
        report.add(BENCH, f"span end -> transition readable, {delay_ms} ms span batching (SDK -> Collector -> "
                          "worker --otel)", f"p50 {_pct(values, 0.5):.2f} s / p99 {_pct(values, 0.99):.2f} s",
                   f"{len(values)} natural runs; run span end to VERIFYING read (read_committed)")


def main(argv: list[str] | None = None) -> int:
    import shutil
    import tempfile

    parser = argparse.ArgumentParser(prog="python -m bench.otel_kafka", description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--apps", default="bridge,worker,pair",
                        help="of bridge, worker, pair, bridge-base; and collector: the real Collector's rows")
    parser.add_argument("--latency-runs", type=int, default=100, help="collector: runs timed with 200 ms batching")
    parser.add_argument("--profile", default="", help="run the bridge and the pair under cProfile, stats into DIR")
    parser.add_argument("--base-tree", default="",
                        help="a checkout (e.g. `git archive <commit> | tar -x -C DIR`) whose bridge runs as app bridge-base")
    args = parser.parse_args(argv)
    global PROFILE_DIR, BASE_TREE
    PROFILE_DIR, BASE_TREE = args.profile, args.base_tree
    workdir = Path(tempfile.mkdtemp(prefix="otel-bench-"))
    report = Report("o otel on Kafka")
    try:
        apps = tuple(args.apps.split(","))
        if set(apps) - {"collector"}:
            otel_kafka(report, workdir, args.runs, args.rounds, apps=tuple(a for a in apps if a != "collector"))
        if "collector" in apps:
            otel_collector(report, workdir, args.runs, args.latency_runs)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    for row in report.rows:
        print(f"| {row.bench} | {row.figure} | {row.value} | {row.note} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
