"""The layout watch on a real broker: it sees partitions added and topics deleted, and never creates one."""

from __future__ import annotations

import asyncio
import uuid

from aiokafka.admin import AIOKafkaAdminClient, NewPartitions, NewTopic

from loopwarden.config import Config
from loopwarden.stages.health.topology import TopologyWatch, co_partitioned, outputs


def test_the_watch_sees_expansion_and_deletion_without_creating_topics(kafka) -> None:
    """Steps grown 4 -> 6 stops folding; agent.health deleted stops producing and is not re-created by the read."""
    p = uuid.uuid4().hex[:8]
    c = Config(broker=kafka.bootstrap, partitions=4, app_id=f"topo-{p}", steps_topic=f"s-{p}",
               outcomes_topic=f"o-{p}", ticks_topic=f"t-{p}", health_topic=f"h-{p}", deadletter_topic=f"d-{p}")

    async def scenario():
        async def until(done, tries=100):
            """Changes on the broker show in its metadata a little later: read until they do."""
            changed = False
            for _ in range(tries):
                verdict, moved = await watch.check()
                changed |= moved
                if done(verdict):
                    break
                await asyncio.sleep(0.1)
            return verdict, changed

        admin = AIOKafkaAdminClient(bootstrap_servers=c.broker)
        await admin.start()
        watch = TopologyWatch(c)
        await watch.start()
        try:
            await admin.create_topics([NewTopic(t, 4, 1) for t in (*co_partitioned(c), *outputs(c))])
            first, _ = await watch.check()
            await admin.create_partitions({c.steps_topic: NewPartitions(6)})
            grown, changed = await until(lambda v: not v.fold)
            await admin.delete_topics([c.health_topic])
            gone, _ = await until(lambda v: not v.produce)
            again, _ = await watch.check()
            present = set(await admin.list_topics())
            auto = await watch.auto_create_enabled()
            return first, grown, changed, gone, again, present, auto
        finally:
            await watch.stop()
            await admin.close()

    first, grown, changed, gone, again, present, auto = asyncio.run(scenario())
    assert first.ok
    assert changed and not grown.fold and grown.produce
    assert grown.problems[0].startswith(f"{c.steps_topic} has 6 partitions, expected 4")
    assert not gone.produce and f"{c.health_topic} is missing" in gone.problems
    assert c.health_topic not in present  # reading the layout never auto-creates a topic
    assert again == gone
    assert auto is True  # the local test broker keeps Kafka's default, which the docs advise against
