"""`loopwarden topics expand` on a real broker: topics grow together, run states and waiting events move."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from loopwarden.engine.assignment import partition_of
from loopwarden.config import Config
from loopwarden.engine.exceptions import TopicLayoutError
from loopwarden.stages.health.expand import expand
from loopwarden.stages.topics import co_partitioned, existing_counts, outputs
from loopwarden.stages.health.topology import LAYOUT_KEY, decode_expansion
from tests.integration.harness import stable_end_offsets


def _config(kafka, **kw) -> Config:
    p = uuid.uuid4().hex[:8]
    return Config(broker=kafka.bootstrap, partitions=4, app_id=f"exp-{p}", steps_topic=f"s-{p}",
                  outcomes_topic=f"o-{p}", ticks_topic=f"t-{p}", health_topic=f"h-{p}", deadletter_topic=f"d-{p}",
                  **kw)


async def _latest(c: Config, topic: str, partition: int) -> tuple[dict, list]:
    """Latest value per key on a partition (read_committed), and every record's key in offset order."""
    reader = AIOKafkaConsumer(bootstrap_servers=c.broker, isolation_level="read_committed",
                              enable_auto_commit=False, auto_offset_reset="earliest")
    await reader.start()
    try:
        tp = TopicPartition(topic, partition)
        reader.assign([tp])
        end = (await stable_end_offsets(c.broker, [tp]))[tp]  # expand()'s transaction's markers written
        latest, keys = {}, []
        while await reader.position(tp) < end:
            for r in (await reader.getmany(tp, timeout_ms=1000)).get(tp, []):
                keys.append(r.key)
                if r.value is None:
                    latest.pop(r.key, None)
                else:
                    latest[r.key] = r.value
        return latest, keys
    finally:
        await reader.stop()


def test_expand_moves_states_and_waiting_events_to_their_new_partition(kafka) -> None:
    """4 -> 6: every co-partitioned topic grows (the verifiers' receipts topic too); each run's state, unconsumed
    steps and receipts end on murmur2 % 6; states that stay are untouched; every changelog partition gets the
    layout record with the boundaries."""
    c = _config(kafka, trusted_outcomes_topic=f"v-{uuid.uuid4().hex[:8]}")
    runs = [f"run-{i}".encode() for i in range(60)]

    async def scenario():
        admin = AIOKafkaAdminClient(bootstrap_servers=c.broker)
        await admin.start()
        await admin.create_topics([NewTopic(t, 4, 1) for t in (*co_partitioned(c), *outputs(c))])
        producer = AIOKafkaProducer(bootstrap_servers=c.broker)
        await producer.start()
        for key in runs:
            p = partition_of(key, 4)
            await producer.send_and_wait(c.changelog_topic, b"state-" + key, key=key, partition=p)
            await producer.send_and_wait(c.steps_topic, b"step-" + key, key=key, partition=p)
            await producer.send_and_wait(c.trusted_outcomes_topic, b"receipt-" + key, key=key, partition=p)
        await producer.stop()
        report = await expand(c, 6)
        counts = await existing_counts(admin, [*co_partitioned(c), *outputs(c)])
        await admin.close()
        changelog = {p: await _latest(c, c.changelog_topic, p) for p in range(6)}
        steps = {p: await _latest(c, c.steps_topic, p) for p in range(6)}
        receipts = {p: await _latest(c, c.trusted_outcomes_topic, p) for p in range(6)}
        return report, counts, changelog, steps, receipts

    report, counts, changelog, steps, receipts = asyncio.run(scenario())
    assert c.trusted_outcomes_topic in co_partitioned(c)
    assert {t: counts[t] for t in co_partitioned(c)} == dict.fromkeys(co_partitioned(c), 6)
    assert counts[c.health_topic] == 4  # outputs are not co-partitioned: left alone
    moving = [k for k in runs if partition_of(k, 4) != partition_of(k, 6)]
    assert report.runs_moved == len(moving) > 0 and report.runs_kept == len(runs) - len(moving)
    assert report.events_copied == 2 * len(moving)  # a step and a receipt each
    for key in runs:
        home = partition_of(key, 6)
        assert changelog[home][0][key] == b"state-" + key
        for p in range(6):
            if p != home:
                assert key not in changelog[p][0]  # moved: a tombstone on the old partition
        assert key in steps[home][1]  # the waiting step is on its new partition
        assert key in receipts[home][1]  # and so is its waiting receipt
    for p in range(6):
        layout = decode_expansion(changelog[p][0][LAYOUT_KEY])
        assert (layout.previous, layout.partitions) == (4, 6)
        if p < 4:
            waiting = sum(partition_of(k, 4) == p for k in runs)
            assert layout.boundary == {c.steps_topic: waiting, c.outcomes_topic: 0, c.trusted_outcomes_topic: waiting}
        else:
            assert layout.boundary == {}


def test_expand_refuses_a_live_group_and_shrinking(kafka) -> None:
    """A worker still in the group, or fewer partitions than now: refused with a line saying why."""
    c = _config(kafka)

    async def scenario():
        admin = AIOKafkaAdminClient(bootstrap_servers=c.broker)
        await admin.start()
        await admin.create_topics([NewTopic(t, 4, 1) for t in (*co_partitioned(c), *outputs(c))])
        await admin.close()
        with pytest.raises(TopicLayoutError, match=r"cannot expand to 3: s-\w+ has 4; Kafka can add partitions, never remove them"):
            await expand(c, 3)
        member = AIOKafkaConsumer(c.steps_topic, bootstrap_servers=c.broker, group_id=c.app_id)
        await member.start()
        await member.getmany(timeout_ms=2000)
        try:
            with pytest.raises(TopicLayoutError, match=r"has 1 active member\(s\): stop every worker first"):
                await expand(c, 8)
        finally:
            await member.stop()

    asyncio.run(scenario())
