"""The real OpenTelemetry Collector (``make otelcol``) on the test broker, and reading ``otlp_spans`` back."""

from __future__ import annotations

import socket
import subprocess
import time
from collections import defaultdict
from pathlib import Path

import yaml
from aiokafka import AIOKafkaConsumer

from dev.localkafka import free_port
from loopwarden.stages.otel import Limits, decode_traces
from loopwarden.stages.otel.mapping import ROLE_RUN
from tests.conftest import REPO
from tests.otel.bridge import Bridge

OTELCOL = REPO / ".tools" / "otelcol"
DEPLOYED = REPO / "deploy" / "otel-collector.yaml"


class Collector:
    """`.tools/otelcol` with a copy of deploy/otel-collector.yaml: the test broker, free ports, a topic of its own."""

    def __init__(self, workdir: Path, bootstrap: str, topic: str, encoding: str = "otlp_proto") -> None:
        assert OTELCOL.is_file(), f"{OTELCOL} missing: run `make otelcol`"
        config = yaml.safe_load(DEPLOYED.read_text())
        self.http_port = free_port()
        self.grpc_port = free_port(exclude=(self.http_port,))
        config["receivers"]["otlp"]["protocols"]["http"]["endpoint"] = f"127.0.0.1:{self.http_port}"
        config["receivers"]["otlp"]["protocols"]["grpc"]["endpoint"] = f"127.0.0.1:{self.grpc_port}"
        kafka = config["exporters"]["kafka"]
        kafka["brokers"] = [bootstrap]
        kafka["traces"] = {"topic": topic, "encoding": encoding}
        # its own metrics endpoint (:8888) would clash between parallel collectors
        config["service"]["telemetry"] = {"metrics": {"level": "none"}}
        self.config_path = workdir / "otel-collector.yaml"
        self.config_path.write_text(yaml.safe_dump(config))
        self.log_path = workdir / "otelcol.log"
        self.proc: subprocess.Popen | None = None

    @property
    def endpoint(self) -> str:
        """The OTLP/HTTP traces URL (the 4318 analogue)."""
        return f"http://127.0.0.1:{self.http_port}/v1/traces"

    @property
    def grpc_endpoint(self) -> str:
        """The OTLP/gRPC receiver (the 4317 analogue); `http://` tells the gRPC exporter to use no TLS."""
        return f"http://127.0.0.1:{self.grpc_port}"

    def start(self, timeout_s: float = 60) -> "Collector":
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen([str(OTELCOL), "--config", str(self.config_path)], stdout=self._log,
                                     stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout_s
        waiting = [self.http_port, self.grpc_port]
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"otelcol exited:\n{self.log_path.read_text()[-3000:]}"
            try:
                socket.create_connection(("127.0.0.1", waiting[0]), timeout=0.5).close()
                waiting.pop(0)
                if not waiting:
                    return self
            except OSError:
                time.sleep(0.2)
        raise TimeoutError(f"otelcol not listening in {timeout_s}s:\n{self.log_path.read_text()[-3000:]}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


async def read_spans(bootstrap: str, topic: str, runs: int, timeout_s: float = 90, quiet_s: float = 1.5) -> list:
    """Records of ``topic`` from the beginning until they hold ``runs`` run spans and nothing more came for
    ``quiet_s`` (spans that end after their run's, e.g. a cancelled tool's, may follow in a later message)."""
    consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest",
                                enable_auto_commit=False, group_id=None)
    await consumer.start()
    records: list = []
    seen = 0
    try:
        deadline = time.monotonic() + timeout_s
        last_new = time.monotonic()
        while time.monotonic() < deadline:
            for recs in (await consumer.getmany(timeout_ms=300)).values():
                for rec in recs:
                    records.append(rec)
                    last_new = time.monotonic()
                    seen += sum(1 for s in decode_traces(rec.value) if s.role == ROLE_RUN)
            if seen >= runs and time.monotonic() - last_new >= quiet_s:
                break
        return records
    finally:
        await consumer.stop()


def bridge_partitions(records: list, limits: Limits = Limits(end_grace_s=2)) -> tuple[list, bytes, list]:
    """Each partition's records through a bridge task of its own, as the engine runs them (one batch per
    poll-sized chunk, committed), then a punctuation after the end grace; the events, per partition order,
    every byte the bridge produced (keys, values, headers, changelog), and its output records."""
    by_partition = defaultdict(list)
    for rec in records:
        by_partition[rec.partition].append(rec)
    events, outputs = [], []
    produced = b""
    for partition, recs in sorted(by_partition.items()):
        b = Bridge()
        b.task = b.new_task(limits=limits)
        for i in range(0, len(recs), 3):
            out = b.task.fold(recs[i:i + 3])
            b.commit(out)
        b.now_ms += int(limits.end_grace_s * 1000) + 1
        b.commit(b.task.fold([], punctuate=True))
        assert b.deadletters == [], [(d.reason, d.error) for d in b.deadletters]
        assert b.counts["otel", "message_not_keyed_by_trace"] == 0  # partition_traces_by_id holds
        events += b.events()
        outputs += b.outputs
        produced += b"".join(o.key + o.value + b"".join(v for _k, v in o.headers) for o in b.outputs)
        produced += b"".join(k + v for k, v in b.store.items())
    # the worker meets the partitions' events interleaved as they come: a run whose traces sit on two
    # partitions (a LangGraph thread resumed) gets each trace's events in order, the earlier trace's first
    first: dict = {}
    for e in events:
        first.setdefault((e.run_id, getattr(e, "segment", None)), e.ts)
    order = {id(e): i for i, e in enumerate(events)}
    events.sort(key=lambda e: (first[e.run_id, getattr(e, "segment", None)], order[id(e)]))
    return events, produced, outputs
