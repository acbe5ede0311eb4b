"""The counter stage's topics for one test: input, output, its changelog (compacted) and dead letters."""

from __future__ import annotations

from aiokafka.admin import AIOKafkaAdminClient, NewTopic


async def counter_topics(bootstrap: str, app_id: str, name: str, in_partitions: int,
                         out_partitions: int) -> tuple[str, str]:
    """Create ``<name>-in`` and ``<name>-out`` with the stage's changelog and dead letters; their names."""
    in_topic, out_topic = f"{name}-in", f"{name}-out"
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([
            NewTopic(in_topic, in_partitions, 1), NewTopic(out_topic, out_partitions, 1),
            NewTopic(f"{app_id}-counts-changelog", in_partitions, 1, topic_configs={"cleanup.policy": "compact"}),
            NewTopic(f"{app_id}-dead", in_partitions, 1),
        ])
    finally:
        await admin.close()
    return in_topic, out_topic
