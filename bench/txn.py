"""Bench f: the floor under the worker's latency — a Kafka transaction's round trips, nothing else.

On an idle local broker, N transactional producers (the worker keeps one per partition) each loop:
begin, produce one record to an output and one to a changelog partition,
``send_offsets_to_transaction``, commit. Reported: the time from begin to commit, p50/p99, with
and without the commit gap the worker keeps (``commit_gap_ms``): a transaction begun right after
the last commit meets CONCURRENT_TRANSACTIONS while the broker writes the markers, and aiokafka (like
the Java client, KAFKA-5477) retries that only after a fixed 20 ms.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from pathlib import Path

from aiokafka import AIOKafkaProducer
from aiokafka.structs import TopicPartition

from bench.common import Report, duration, progress
from bench.ingest import create_topics
from dev.localkafka import LocalKafka


async def _one(bootstrap: str, j: int, txns: int, gap_s: float, out: list[float]) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, transactional_id=f"bench-txn-{j}-{gap_s}",
                                enable_idempotence=True, acks="all", linger_ms=0, retry_backoff_ms=10)
    await producer.start()
    try:
        for i in range(txns):
            await asyncio.sleep(gap_s)
            t0 = time.perf_counter()
            await producer.begin_transaction()
            await producer.send("txn-out", b"x" * 100, key=b"k", partition=j)
            fut = await producer.send("txn-changelog", b"y" * 180, key=b"k", partition=j)
            await fut
            await producer.send_offsets_to_transaction({TopicPartition("txn-in", j): i + 1}, "bench-txn")
            await producer.commit_transaction()
            if i >= 10:  # after warm-up
                out.append(time.perf_counter() - t0)
    finally:
        await producer.stop()


def _q(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] if values else float("nan")


def txn_floor(report: Report, workdir: Path, txns: int = 150, producers: tuple[int, ...] = (1, 4, 8)) -> None:
    progress("[f] transaction floor: starting a local Kafka broker (idle, nothing else running) ...")
    broker = LocalKafka(workdir / "txn-kafka", heap="512m").start(timeout_s=120)
    try:
        asyncio.run(create_topics(broker.bootstrap, ["txn-in", "txn-out", "txn-changelog"], max(producers)))
        for n in producers:
            for gap_ms in (0, 6):
                out: list[float] = []

                async def go() -> None:
                    await asyncio.gather(*(_one(broker.bootstrap, j, txns, gap_ms / 1000, out) for j in range(n)))

                progress(f"[f]   {n} producer(s), commit gap {gap_ms} ms ...")
                asyncio.run(go())
                report.add("f txn", f"{n} producer(s), gap {gap_ms} ms: begin -> commit p50 / p99",
                           f"{duration(statistics.median(out))} / {duration(_q(out, 0.99))}",
                           f"{len(out):,} transactions; a cycle is gap + this")
    finally:
        broker.stop()
