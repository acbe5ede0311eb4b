"""The board's reader of agent.health on the real broker: every partition, partitions added later, committed only."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace

import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewPartitions, NewTopic

from loopwarden.api.board import reader
from tests.integration.harness import unique_config
from tests.integration.test_board_browser import transition

pytestmark = pytest.mark.timeout(120)


async def _until(predicate, timeout_s: float, what: str) -> float:
    began = time.monotonic()
    while not predicate():
        assert time.monotonic() - began < timeout_s, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)
    return time.monotonic() - began


def test_the_reader_follows_partitions_added_later_and_skips_aborted_transactions(kafka, monkeypatch) -> None:
    """A transition on a partition added to agent.health while the board runs is shown within the
    check interval; one written in an aborted transaction never is (read_committed)."""
    monkeypatch.setattr(reader, "PARTITIONS_CHECK_S", 1.0)
    config = replace(unique_config(kafka.bootstrap), board_lookback_s=3600)
    topic = config.health_topic
    now = int(time.time() * 1000)

    async def go() -> None:
        admin = AIOKafkaAdminClient(bootstrap_servers=config.bootstrap)
        await admin.start()
        await admin.create_topics([NewTopic(topic, 2, 1)])
        producer = AIOKafkaProducer(bootstrap_servers=config.bootstrap, transactional_id=f"{topic}-test")
        await producer.start()
        board = reader.Board(config)
        task = asyncio.create_task(board.consume())
        try:
            await producer.begin_transaction()
            await producer.send_and_wait(topic, transition("r-0", 1, now, None, "STUCK"), partition=0)
            await producer.commit_transaction()
            await producer.begin_transaction()
            await producer.send_and_wait(topic, transition("r-aborted", 1, now, None, "FAILED"), partition=1)
            await producer.abort_transaction()
            await _until(lambda: "r-0" in board.fleet.runs, 15, "r-0")
            await admin.create_partitions({topic: NewPartitions(total_count=4)})
            later = AIOKafkaProducer(bootstrap_servers=config.bootstrap)  # one that sees the new layout
            await later.start()
            try:
                while len(await later.partitions_for(topic)) < 4:
                    await asyncio.sleep(0.1)
                await later.send_and_wait(topic, transition("r-3", 1, now, None, "FAILED"), partition=3)
            finally:
                await later.stop()
            took = await _until(lambda: "r-3" in board.fleet.runs, 10, "r-3 on the added partition")
            print(f"\nboard: a partition added while running was read within {took:.1f} s")
            assert "r-aborted" not in board.fleet.runs and set(board.fleet.runs) == {"r-0", "r-3"}
        finally:
            board.stop()
            await asyncio.gather(task, return_exceptions=True)
            await producer.stop()
            await admin.close()

    asyncio.run(go())
