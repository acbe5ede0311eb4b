"""A checkpoint's transaction on a real broker: an output topic with fewer partitions than the router learned, and a
producer fenced between two of a transaction's sends."""

from __future__ import annotations

import asyncio
import gc

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka import AIOKafkaProducer
from aiokafka.errors import ProducerFenced, UnknownTopicOrPartitionError

from loopwarden.stages.health.batch import HealthFolded
from loopwarden.engine.checkpoint import Checkpoint, _Outbox
from loopwarden.engine.manager import RECOVERABLE
from loopwarden.engine.recovery import transactional_producer
from loopwarden.engine.stage import Output
from loopwarden.engine.outputs import Router
from loopwarden.stages.topics import existing_counts
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
            batch = HealthFolded(outputs=[Output(health, b"run-1", b"{}")], changes={b"run-1": b"state"},
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


def test_a_producer_fenced_between_two_sends_of_a_transaction_fails_it_as_fenced(kafka) -> None:
    """Another producer takes the partition's transactional id after this one began its transaction. aiokafka's
    sender learns of the fence when it adds the first batch's partition to the transaction, fails that batch and
    leaves the transaction; the next send then raises ``IllegalOperation`` (no Kafka error: the engine would take it
    for a bug of its own and stop the worker). The outbox raises the first batch's cause
    instead, ``ProducerFenced``; and a whole checkpoint's commit by a fenced producer fails so too, whichever send
    the fence is found at."""
    config = unique_config(kafka.bootstrap, partitions=2)
    health, changelog = config.health_topic, f"{config.app_id}-changelog"

    async def scenario() -> list[tuple[type, str]]:
        admin = AIOKafkaAdminClient(bootstrap_servers=config.broker)
        await admin.start()
        fenced, checkpointed = transactional_producer(config, 0), transactional_producer(config, 1)
        zombies = [AIOKafkaProducer(bootstrap_servers=config.broker, transactional_id=f"{config.app_id}-{p}")
                   for p in (0, 1)]
        outcomes: list[BaseException | None] = []
        try:
            await admin.create_topics([NewTopic(t, 2, 1) for t in (health, changelog)])
            await fenced.start()
            await checkpointed.start()
            # The outbox alone: the fence found at its first send, before its second.
            await fenced.begin_transaction()
            await zombies[0].start()
            outbox = _Outbox(fenced)
            outbox.put(health, 0, b"run-1", b"{}")
            await outbox.flush()
            await asyncio.wait_for(asyncio.wait([outbox.sent[0][2]]), 30)
            assert isinstance(outbox.sent[0][2].exception(), ProducerFenced)
            outbox.put(changelog, 0, b"run-1", b"state")
            try:
                await outbox.flush()
                outcomes.append(None)
            except BaseException as exc:  # noqa: BLE001 - what it raised is the finding
                outcomes.append(exc)
            # A checkpoint's whole commit, its transaction begun before the fence.
            begun = asyncio.ensure_future(checkpointed.begin_transaction())
            await zombies[1].start()
            router = Router(2, keyed_like_input=frozenset({health}))
            await router.learn(checkpointed, [health])
            batch = HealthFolded(outputs=[Output(health, b"run-1", b"{}")], changes={b"run-1": b"state"},
                          offsets={config.steps_topic: 1}, consumed=1)
            try:
                await Checkpoint(checkpointed, 1, config.app_id, changelog, router).commit(batch, [], begun=begun)
                outcomes.append(None)
            except BaseException as exc:  # noqa: BLE001
                outcomes.append(exc)
            return [(type(exc), repr(exc)) for exc in outcomes]  # not the errors: their tracebacks hold the producers
        finally:
            for producer in (fenced, checkpointed, *zombies):
                await producer.stop()
            await admin.close()

    (outbox_raised, outbox_repr), (commit_raised, commit_repr) = run(scenario())
    # aiokafka fails its batches' drain waiters with the fence too, and nothing reads them: their "never retrieved"
    # finalizers log here, not in whichever test the garbage collector next runs in (one asserts no such log).
    gc.collect()
    assert outbox_raised is ProducerFenced, outbox_repr
    assert commit_raised is ProducerFenced, commit_repr
