"""Reading how far an old partition was forwarded after an expansion (loopwarden.engine.horizons), on a real broker."""

from __future__ import annotations

from types import SimpleNamespace

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from loopwarden.engine.horizons import Horizons
from loopwarden.engine.recovery import transactional_producer
from loopwarden.stages.health.settle import FORWARDED
from tests.integration.harness import run, unique_config


def test_an_old_partition_reads_as_forwarded_only_once_the_forwarded_records_transaction_is_decided(kafka) -> None:
    """The broker answers EndTxn before it writes the markers, and the group's offsets are committed after EndTxn:
    the old partition's offset can read as past a record whose forwarded copy is still in an open transaction on
    the new partition. A horizon read then must not let the new partition apply its direct records yet; once the
    transaction commits, the horizon needs the forwarded record in hand."""
    config = unique_config(kafka.bootstrap, partitions=2)
    topic, old, new = config.steps_topic, TopicPartition(config.steps_topic, 0), TopicPartition(config.steps_topic, 1)

    async def scenario() -> None:
        admin = AIOKafkaAdminClient(bootstrap_servers=config.broker)
        forwarder = transactional_producer(config, 0)
        group = AIOKafkaConsumer(bootstrap_servers=config.broker, group_id=config.app_id, enable_auto_commit=False)
        horizons = Horizons(config, SimpleNamespace(consumer=group, tracked=(topic,)))  # type: ignore[arg-type]
        await admin.start()
        try:
            await admin.create_topics([NewTopic(topic, 2, 1)])
            await forwarder.start()
            await group.start()
            async with forwarder.transaction():  # the old partition's record, consumed (a direct one lands on new)
                await forwarder.send_and_wait(topic, b"{}", key=b"run", partition=0)
                await forwarder.send_and_wait(topic, b"{}", key=b"direct", partition=1)
            await forwarder.begin_transaction()  # its forwarded copy, in a transaction not decided yet
            forwarded = await forwarder.send_and_wait(topic, b"{}", key=b"run", partition=1,
                                                      headers=[(FORWARDED, b"0")])
            group.assign([old])
            await group.commit({old: 1})  # the group's offset, committed as if after EndTxn's answer
            open_read = await horizons.read(1, {0})
            assert open_read is None or open_read.first[0] == -1 or open_read.need[topic] > forwarded.offset, open_read
            await forwarder.commit_transaction()
            decided = await horizons.read(1, {0})
            assert decided.first == {0: None} and decided.need == {topic: forwarded.offset + 1}, decided
        finally:
            await horizons.stop()
            await group.stop()
            await forwarder.stop()
            await admin.close()

    run(scenario())
