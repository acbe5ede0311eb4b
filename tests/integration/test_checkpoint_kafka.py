"""A checkpoint's transaction on a real broker when an output topic has fewer partitions than the router learned."""

from __future__ import annotations

import asyncio

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import UnknownTopicOrPartitionError

from loopwarden.streams.batch import Batch
from loopwarden.streams.checkpoint import Checkpoint
from loopwarden.streams.manager import RECOVERABLE
from loopwarden.streams.recovery import transactional_producer
from loopwarden.streams.stage import Output
from loopwarden.streams.topics import Router, existing_counts
from tests.integration.harness import delete_topic, run, unique_config


def test_an_output_re_created_with_fewer_partitions_fails_the_commit_as_a_kafka_error(kafka) -> None:
    """The router learned 4 partitions of agent.health; the topic is then deleted and created with 1, and a
    producer owned afterwards sees 1. A transition routed to partition 2 fails the commit with
    UnknownTopicOrPartitionError naming the topic and partition (one the engine recovers from), not with
    aiokafka's bare ``assert`` (which the engine would take for a bug of its own and stop on)."""
    config = unique_config(kafka.bootstrap, partitions=4)
    health, changelog = config.health_topic, f"{config.app_id}-changelog"

    async def scenario() -> BaseException | None:
        admin = AIOKafkaAdminClient(bootstrap_servers=config.broker)
        await admin.start()
        first, later = transactional_producer(config, 0), transactional_producer(config, 2)
        try:
            await admin.create_topics([NewTopic(t, 4, 1) for t in (health, changelog)])
            await first.start()
            router = Router(4, keyed_like_input=frozenset({health}))
            await router.learn(first, [health])
            assert router.counts == {health: 4}
            await delete_topic(config, health)  # and wait until the broker no longer lists it
            await admin.create_topics([NewTopic(health, 1, 1)])
            for _ in range(100):
                if await existing_counts(admin, [health]) == {health: 1}:
                    break
                await asyncio.sleep(0.1)
            await later.start()
            assert await later.partitions_for(health) == {0}
            batch = Batch(outputs=[Output(health, b"run-1", b"{}")], changes={b"run-1": b"state"},
                          offsets={config.steps_topic: 1}, consumed=1)
            try:
                await Checkpoint(later, 2, config.app_id, changelog, router).commit(batch, [])
            except BaseException as exc:  # noqa: BLE001 - what it raised is the finding
                await later.abort_transaction()
                return exc
            return None
        finally:
            await first.stop()
            await later.stop()
            await admin.close()

    raised = run(scenario())
    assert isinstance(raised, UnknownTopicOrPartitionError), repr(raised)
    assert isinstance(raised, RECOVERABLE)
    assert f"{health} has no partition 2 in this producer's metadata" in str(raised)
