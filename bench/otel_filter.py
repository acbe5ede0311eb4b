"""The bridge's CPU per span with and without the Collector's content filter (deploy/otel-collector.yaml).

``python -m bench.otel_filter [--runs N] [--repeats R]``; ``otel_filter_rows(report, workdir, quick)`` for
``bench/run.py``.

The traces of ``bench/otel.py`` (a run: 1 ``invoke_agent`` + 5 ``chat`` + 4 ``execute_tool`` spans, with the
content Pydantic AI exports by default) are posted over OTLP/HTTP (50 messages, about 500 spans, per export)
to two real Collectors (``make otelcol``) on one local broker: one with the shipped config, one with the same
config less its two content processors (``filter/unread``, ``transform/content``): the same receiver,
batching and exporter. Each writes its own 1-partition ``otlp_spans``; the bench reads both back and folds
each through ``BridgeTask.fold`` (batches of 500, committed as the engine does), round-robin, medians over
repeats. Rows: the bridge's CPU per span, its decoding alone and the bytes per span it reads, on each topic;
and each Collector's own CPU per span (user + system of its process while it takes the posts in, /proc),
since the filter moves work from the bridge to the Collector.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import http.client
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import yaml
from aiokafka import AIOKafkaConsumer

from bench.common import Report, cpu_s, median, progress, si
from bench.ingest import create_topics, start_broker
from bench.otel import _bridge, traces
from dev.localkafka import free_port
from loopwarden import gctune
from loopwarden.stages.otel import decode_traces

REPO = Path(__file__).resolve().parent.parent
OTELCOL = REPO / ".tools" / "otelcol"
DEPLOYED = REPO / "deploy" / "otel-collector.yaml"
CONTENT_PROCESSORS = ("filter/unread", "transform/content")
BENCH = "o otel"


class _Collector:
    """``.tools/otelcol`` on the deployed config (``filtered``) or on it less the content processors."""

    def __init__(self, workdir: Path, bootstrap: str, topic: str, filtered: bool) -> None:
        config = yaml.safe_load(DEPLOYED.read_text())
        self.port = free_port()
        grpc = free_port(exclude=(self.port,))
        config["receivers"]["otlp"]["protocols"] = {"http": {"endpoint": f"127.0.0.1:{self.port}"},
                                                   "grpc": {"endpoint": f"127.0.0.1:{grpc}"}}
        config["exporters"]["kafka"]["brokers"] = [bootstrap]
        config["exporters"]["kafka"]["traces"]["topic"] = topic
        pipeline = config["service"]["pipelines"]["traces"]
        if not filtered:
            pipeline["processors"] = [p for p in pipeline["processors"] if p not in CONTENT_PROCESSORS]
            for name in CONTENT_PROCESSORS:
                config["processors"].pop(name)
        config["service"]["telemetry"] = {"metrics": {"level": "none"}}
        path = workdir / f"otelcol-{topic}.yaml"
        path.write_text(yaml.safe_dump(config))
        self.log = open(workdir / f"otelcol-{topic}.log", "wb")
        self.proc = subprocess.Popen([str(OTELCOL), "--config", str(path)], stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while True:
            try:
                http.client.HTTPConnection("127.0.0.1", self.port, timeout=1).connect()
                return
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"otelcol did not start: see {workdir}/otelcol-{topic}.log") from None
                time.sleep(0.2)

    def post(self, bodies: list[bytes], per_export: int = 50) -> float:
        """The bodies as OTLP/HTTP exports of ``per_export`` messages each (an SDK's batch: TracesData and
        ExportTraceServiceRequest share a wire format, and concatenated they are one message); returns the
        Collector's CPU seconds meanwhile."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        c0 = cpu_s(self.proc.pid)
        for i in range(0, len(bodies), per_export):
            body = b"".join(bodies[i:i + per_export])
            conn.request("POST", "/v1/traces", body, {"Content-Type": "application/x-protobuf"})
            resp = conn.getresponse()
            resp.read()
            if resp.status != 200:
                raise RuntimeError(f"otelcol answered {resp.status}")
        conn.close()
        time.sleep(1.0)  # its 200 ms batch and the export
        return cpu_s(self.proc.pid) - c0

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


async def _read_back(bootstrap: str, topic: str, spans: int, timeout_s: float = 120) -> list:
    """The topic's records from the beginning until they hold ``spans`` spans."""
    consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest",
                                enable_auto_commit=False, group_id=None, max_partition_fetch_bytes=8 << 20)
    await consumer.start()
    records, seen = [], 0
    try:
        deadline = time.monotonic() + timeout_s
        while seen < spans:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{topic}: {seen} of {spans} spans in {timeout_s} s")
            for recs in (await consumer.getmany(timeout_ms=500)).values():
                records += recs
                seen += sum(len(decode_traces(r.value)) for r in recs)
        return records
    finally:
        await consumer.stop()


def measure(workdir: Path, runs: int, repeats: int) -> dict:
    """Both paths' Collector CPU and the bridge's CPU (medians over ``repeats``) and bytes, per span."""
    gctune.for_streaming()
    records, spans = traces(runs, 5, 4)
    bodies = [r.value for r in records]
    kafka = start_broker(workdir / "kafka")
    got: dict = {}
    try:
        for filtered in (False, True):
            topic = f"otlp_spans-{'filtered' if filtered else 'unfiltered'}"
            asyncio.run(create_topics(kafka.bootstrap, [topic], partitions=1))
            collector = _Collector(workdir, kafka.bootstrap, topic, filtered)
            try:
                collector_s = collector.post(bodies)
            finally:
                collector.stop()
            back = asyncio.run(_read_back(kafka.bootstrap, topic, spans))
            got[filtered] = {"records": back, "collector_s": collector_s, "bytes": sum(len(r.value) for r in back)}
    finally:
        kafka.stop()
    times: dict[tuple[bool, str], list[float]] = {(f, row): [] for f in (False, True) for row in ("bridge", "decode")}
    for _ in range(repeats):
        for filtered in (False, True):
            gc.collect()
            times[filtered, "bridge"].append(_bridge(got[filtered]["records"])[0])
            gc.collect()
            times[filtered, "decode"].append(_decode(got[filtered]["records"]))
    return {"spans": spans, "sent_bytes": sum(map(len, bodies)),
            **{k: {**v, "bridge_s": median(times[k, "bridge"]), "decode_s": median(times[k, "decode"]),
                   "messages": len(v["records"])} for k, v in got.items()}}


def _decode(records: list) -> float:
    """CPU seconds of the bridge's decoding alone (decode_traces: the part of its work the filter can change)."""
    c0 = time.process_time()
    for r in records:
        decode_traces(r.value)
    return time.process_time() - c0


def otel_filter_rows(report: Report, workdir: Path, quick: bool) -> None:
    """The rows of the content filter's cost and gain, for ``python -m bench.run --only otel``."""
    progress("[o] the Collector's content filter: two real Collectors on a local broker ...")
    m = measure(workdir / "otel-filter", 500 if quick else 2000, 3 if quick else 5)
    spans = m["spans"]
    for filtered, label in ((False, "without the content filter"), (True, "with the content filter (deploy/)")):
        r = m[filtered]
        report.add(BENCH, f"bridge fold, Collector {label}", f"{r['bridge_s'] / spans * 1e6:.2f} µs CPU/span",
                   f"{si(spans / r['bridge_s'])} spans/s; of it decoding {r['decode_s'] / spans * 1e6:.2f} µs/span; "
                   f"reads {r['bytes'] / spans:.0f} B/span in {r['messages']:,} messages")
        report.add(BENCH, f"the Collector itself, {label}", f"{r['collector_s'] / spans * 1e6:.2f} µs CPU/span",
                   "OTLP/HTTP in, batch, Kafka out (its process's user + system CPU)")
    report.add(BENCH, "bridge CPU per span, filtered : unfiltered", f"{m[True]['bridge_s'] / m[False]['bridge_s']:.2f}x",
               f"{spans:,} spans of {m['sent_bytes'] / spans:.0f} B each as the runtime sent them")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.otel_filter", description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    if not OTELCOL.is_file():
        raise SystemExit(f"{OTELCOL} missing: run `make otelcol`")
    workdir = Path(tempfile.mkdtemp(prefix="bench-otel-filter-"))
    try:
        m = measure(workdir, args.runs, args.repeats)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    spans = m["spans"]
    print(f"{args.runs:,} runs = {spans:,} spans, {m['sent_bytes'] / spans:.0f} B/span as sent; medians of {args.repeats}")
    print(f"{'Collector config':<34} {'bridge us/span':>14} {'spans/s':>9} {'decode us/span':>14} {'B/span read':>11} "
          f"{'messages':>9} {'otelcol us/span':>15}")
    for filtered, label in ((False, "without filter/unread, transform"), (True, "deploy/otel-collector.yaml")):
        r = m[filtered]
        print(f"{label:<34} {r['bridge_s'] / spans * 1e6:>14.2f} {si(spans / r['bridge_s']):>9} "
              f"{r['decode_s'] / spans * 1e6:>14.2f} {r['bytes'] / spans:>11.0f} {r['messages']:>9,} {r['collector_s'] / spans * 1e6:>15.2f}")
    print(f"bridge CPU per span, filtered : unfiltered = {m[True]['bridge_s'] / m[False]['bridge_s']:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
