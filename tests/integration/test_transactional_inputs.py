"""Inputs written by a transactional producer (the OpenTelemetry bridge writes agent.steps so).

Each transaction ends in a commit marker, a control record that takes an offset of its own and is never
handed to a consumer. A partition whose batch ends at a transaction's last record has every record of
its input all the same: it is caught up, its wall-clock timers fire, and the other input's records are
not held back for it (stream-time alignment).
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from pathlib import Path

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from loopwarden.publisher import Publisher
from loopwarden.engine.alignment import Alignment
from loopwarden.stages.topics import ensure_topics
from tests.builders import ended, receipt, started, step
from tests.integration.harness import (group_offsets, make_worker, read_topic, run, stable_end_offsets, transitions,
                                      unique_config)


def _json(event: dict) -> bytes:
    return json.dumps(event).encode()


LONG = [{"kind": "step_count", "count": 100000}]  # no stop condition fires while the busy runs step


def _producer(bootstrap: str) -> AIOKafkaProducer:
    return AIOKafkaProducer(bootstrap_servers=bootstrap, transactional_id=f"tx-{uuid.uuid4().hex[:8]}",
                            enable_idempotence=True)


def test_a_batch_ending_at_a_transactions_last_record_is_caught_up(kafka) -> None:
    """Alignment.lagging on a real consumer: records of three transactions read to the end are the whole input
    (the markers after them are no records; the batch's last record + 1 is 5, the last stable offset 6); with
    more records of the topic handed over after the batch, it is behind."""
    topic = f"tx-in-{uuid.uuid4().hex[:8]}"

    async def go() -> tuple:
        producer = _producer(kafka.bootstrap)
        await producer.start()
        try:
            for i in range(3):
                async with producer.transaction():
                    await producer.send(topic, f"v{i}".encode(), key=b"k", partition=0)
        finally:
            await producer.stop()
        consumer = AIOKafkaConsumer(bootstrap_servers=kafka.bootstrap, isolation_level="read_committed",
                                    enable_auto_commit=False)
        await consumer.start()
        try:
            tp = TopicPartition(topic, 0)
            consumer.assign([tp])
            await consumer.seek_to_beginning(tp)
            records: list = []
            deadline = time.monotonic() + 30
            while len(records) < 3 and time.monotonic() < deadline:
                for batch in (await consumer.getmany(timeout_ms=500)).values():
                    records += batch
            alignment = Alignment(consumer, 0, {topic: "steps"}, 1000)
            return ([r.offset for r in records], consumer.last_stable_offset(tp), await consumer.position(tp),
                    await alignment.lagging(set()), await alignment.lagging({topic}))
        finally:
            await consumer.stop()

    offsets, stable, position, caught_up, handed_more = run(go())
    assert offsets == [0, 2, 4] and stable == 6  # each record's transaction marker takes the offset after it
    assert position == 6  # the consumer's position is past the last marker
    assert caught_up == (True, set())
    assert handed_more == (False, {"steps"})  # records of the topic came after the batch: it is behind


async def _busy_stream(config, seconds: float, receipt_at_s: float, writers: int = 4) -> float:
    """Runs "stuck" (1 s inactivity timeout, one step) and "verified" (ends naturally); then ``writers``
    transactional producers each give a run of their own a step per transaction, back to back, for ``seconds``
    (a transaction commits every few ms: nearly every batch the worker takes ends at a marker).
    ``receipt_at_s`` in, "verified"'s receipt goes to the outcomes topic (no transaction), stamped 2 s ahead:
    later than any step the worker has then. Returns the wall time (ms) the stream stopped."""
    producers = [_producer(config.bootstrap) for _ in range(writers)]
    for producer in producers:
        await producer.start()
    try:
        now = int(time.time() * 1000)
        async with producers[0].transaction():
            for run_id, timeout in (("stuck", 1.0), ("verified", 300.0), *((f"busy-{i}", 300.0) for i in range(writers))):
                event = started(run_id, now, LONG, agent="a", inactivity_timeout_s=timeout)
                await producers[0].send(config.steps_topic, _json(event), key=run_id.encode())
            await producers[0].send(config.steps_topic, _json(step(0, ("lookup", "result"), run="stuck", ts=now)), key=b"stuck")
            for event in (step(0, run="verified", ts=now), ended("natural_finish", 1, run="verified", ts=now)):
                await producers[0].send(config.steps_topic, _json(event), key=b"verified")
        start = time.monotonic()

        async def busy(i: int, producer: AIOKafkaProducer) -> None:
            run_id, n = f"busy-{i}", 0
            while time.monotonic() - start < seconds:
                event = step(n, ("lookup", "result"), run=run_id, ts=int(time.time() * 1000))
                async with producer.transaction():
                    await producer.send(config.steps_topic, _json(event), key=run_id.encode())
                n += 1

        async def late_receipt() -> None:
            await asyncio.sleep(receipt_at_s)
            value = _json(receipt("rc-1", run="verified", ts=int(time.time() * 1000) + 2000))
            async with Publisher(config.bootstrap) as pub:
                await pub.publish_raw(config.outcomes_topic, b"verified", value, wait=True)

        await asyncio.gather(late_receipt(), *(busy(i, p) for i, p in enumerate(producers)))
        return time.time() * 1000
    finally:
        for producer in producers:
            await producer.stop()


def test_timers_fire_and_receipts_pass_while_a_transactional_producer_writes_the_steps(kafka, tmp_path: Path) -> None:
    """While other runs' steps arrive in back-to-back transactions: a run goes STUCK about its 1 s timeout
    after its last step, and a receipt stamped later than every step so far is applied within seconds, not
    held for the stream-time alignment's 20 s (``align_max_ms``) nor until the stream stops. Idle afterwards, the
    partition has no lag and is not stalled (its input ends in a marker), and the group's offsets are at the end."""
    config = unique_config(kafka.bootstrap, partitions=1)
    worker = make_worker(config, tmp_path, align_max_ms=20_000, stall_timeout_s=2).start()
    try:
        run(ensure_topics(worker.config))
        stopped_ms = run(_busy_stream(worker.config, seconds=10.0, receipt_at_s=2.0))
        want = {("stuck", "STUCK"), ("verified", "VERIFIED_COMPLETE")}
        ts = transitions(run(read_topic(worker.config, worker.config.health_topic,
                                        lambda rs: want <= {(t["run_id"], t["to_state"]) for t in transitions(rs)}, 60)))
        time.sleep(4)  # the stream stopped; twice the stall timeout
        metrics = {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
                   for line in worker.get("/metrics")[1].decode().splitlines() if line.startswith("loopwarden_")}
        group = run(group_offsets(worker.config, worker.config.steps_topic))
        ends = run(stable_end_offsets(kafka.bootstrap, [TopicPartition(worker.config.steps_topic, 0)]))
    finally:
        worker.stop()
    got = {(t["run_id"], t["to_state"]): t for t in ts}
    stuck, verified = got["stuck", "STUCK"], got["verified", "VERIFIED_COMPLETE"]
    assert stuck["reason"] == "no_progress"
    assert stuck["emitted_ts"] - stuck["ts"] < 3000, stuck  # fired on time, while the steps kept coming
    assert verified["emitted_ts"] < stopped_ms - 3000, (verified, stopped_ms)  # not held until the stream stopped
    # Idle after the stream: no lag (the last marker is no record), no stall, the group's offsets at the end.
    assert metrics['loopwarden_consumer_lag{partition="0",topic="steps"}'] == 0, metrics
    assert metrics["loopwarden_stalled_partitions"] == 0 and metrics["loopwarden_stalls_total"] == 0, metrics
    assert group[0] == ends[TopicPartition(worker.config.steps_topic, 0)]
