"""A partition owned again after a fence restores beside the loop: the worker's other partitions go on.

The counter stage (tests/engine/counter_stage.py) runs in this process on the real broker, two
input partitions, partition 0's changelog long (a few hundred thousand records: seconds to
restore). A producer with partition 0's transactional id fences the engine's; its next transaction
fails, the partition is dropped and owned again. While that restore is under way, records
published to partition 1 must be folded and committed: a retry run inline in the loop, under its lock,
would feed no other partition until it ended. The fenced batch is counted once.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import replace
from pathlib import Path

import pytest
from aiokafka import AIOKafkaProducer

from loopwarden.engine.loop import Engine
from tests.engine.counter_stage import CounterStage
from tests.engine.topics import counter_topics
from tests.integration.harness import read_all, run, unique_config

pytestmark = pytest.mark.timeout(300)

FILLER = 400_000  # partition 0's changelog records: its restore must outlast a commit of partition 1


async def _fill_changelog(bootstrap: str, topic: str, n: int) -> None:
    """``n`` counts of keys nobody sends on partition 0 of the changelog: what its restore reads."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=20, max_batch_size=1 << 20)
    await producer.start()
    try:
        batch, futures = producer.create_batch(), []
        for i in range(n):
            if batch.append(key=b"filler-%d" % i, value=b"1", timestamp=None) is None:
                futures.append(await producer.send_batch(batch, topic, partition=0))
                batch = producer.create_batch()
                batch.append(key=b"filler-%d" % i, value=b"1", timestamp=None)
        futures.append(await producer.send_batch(batch, topic, partition=0))
        await asyncio.gather(*futures)
    finally:
        await producer.stop()


async def _send(producer: AIOKafkaProducer, topic: str, partition: int, keys: list[bytes]) -> int:
    """Publish one record per key to ``partition`` at once; the offset after the last."""
    sent = [await producer.send(topic, b"x", key=key, partition=partition) for key in keys]
    return (await asyncio.gather(*sent))[-1].offset + 1


async def _until(check, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.01)


def test_a_partition_owned_again_after_a_fence_restores_while_the_others_commit(kafka, tmp_path: Path) -> None:
    tag = uuid.uuid4().hex[:8]
    config = replace(unique_config(kafka.bootstrap, partitions=2), session_timeout_s=3.0,
                     data_dir=str(tmp_path / "data"), store="memory", batch_wait_ms=5)
    in_topic, out_topic = run(counter_topics(kafka.bootstrap, config.app_id, f"reown-{tag}", 2, 2))
    run(_fill_changelog(kafka.bootstrap, f"{config.app_id}-counts-changelog", FILLER))

    async def scenario() -> dict:
        engine = Engine(config, CounterStage(in_topic, out_topic, config.app_id))
        runner = asyncio.create_task(engine.run())
        publisher = AIOKafkaProducer(bootstrap_servers=kafka.bootstrap, acks="all")
        await publisher.start()
        seen: dict = {}
        try:
            await _until(lambda: engine.ready and len(engine.owned_partitions()) == 2, 120, "never owned both")
            p1 = engine.assigned[1]
            first = await _send(publisher, in_topic, 1, [b"one"])
            await _until(lambda: p1.committed.get(in_topic, 0) >= first, 30, "partition 1 never committed")
            # Fence partition 0's producer; its next transaction fails and the partition is owned again.
            zombie = AIOKafkaProducer(bootstrap_servers=kafka.bootstrap, transactional_id=f"{config.app_id}-0")
            await zombie.start()
            try:
                await _send(publisher, in_topic, 0, [b"zero"])
                await _until(lambda: engine.assigned[0].owned is None, 60, "partition 0 was never dropped")
                await _until(lambda: 0 in engine.reowning.tasks, 60, "partition 0 was never owned again")
                started = time.monotonic()
                # Published once the restore is under way: folded and committed before it ends.
                end = await _send(publisher, in_topic, 1, [b"one-%d" % i for i in range(20)])
                await _until(lambda: p1.committed.get(in_topic, 0) >= end or engine.assigned[0].owned is not None,
                             120, "neither partition 1 committed nor partition 0 was owned again")
                seen["p1_s"] = time.monotonic() - started
                seen["p1_committed"] = p1.committed.get(in_topic, 0) >= end
                seen["p0_owned_then"] = engine.assigned[0].owned is not None
                await _until(lambda: engine.assigned[0].owned is not None, 120, "partition 0 never owned again")
                seen["restore_s"] = time.monotonic() - started
            finally:
                await zombie.stop()
            zero = await _send(publisher, in_topic, 0, [b"zero"])
            p0 = engine.assigned[0]
            await _until(lambda: p0.committed.get(in_topic, 0) >= zero, 60, "partition 0 never committed again")
        finally:
            await publisher.stop()
            engine.stop()
            await asyncio.wait_for(runner, 60)
        return seen

    seen = run(scenario())
    assert seen["p1_committed"] and not seen["p0_owned_then"], seen
    counts: dict[bytes, list[int]] = {}
    for r in run(read_all(config, out_topic)):
        counts.setdefault(r.key, []).append(int(r.value.split(b" ")[0]))
    assert sorted(counts[b"zero"]) == [1, 2], counts[b"zero"]  # the fenced batch's record, counted once
    assert sorted(counts[b"one"]) == [1]
    assert all(counts[b"one-%d" % i] == [1] for i in range(20))
