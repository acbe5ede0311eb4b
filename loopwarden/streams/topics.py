"""Topic layout: create what is missing, refuse what does not fit."""

from __future__ import annotations

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaError

from loopwarden.streams.assignment import partition_of
from loopwarden.streams.config import Config
from loopwarden.streams.exceptions import TopicLayoutError
from loopwarden.streams.security import client_options


# The changelog keeps each run's last state: compaction drops older ones, tombstones go after a day.
COMPACTED = {"cleanup.policy": "compact", "delete.retention.ms": "86400000"}


async def ensure_topics(config: Config, timeout_s: float = 30) -> None:
    """Create the topics if missing; refuse input topics that are not co-partitioned.

    The input topics, the ticks topic and the changelog must have the same partition
    count: partition i of each belongs to the worker that owns partition i.
    """
    admin = AIOKafkaAdminClient(**client_options(config), request_timeout_ms=int(timeout_s * 1000))
    await admin.start()
    try:
        wanted = [config.steps_topic, config.outcomes_topic, config.ticks_topic, config.health_topic,
                  config.deadletter_topic, config.changelog_topic]
        # Describe only topics that exist: a metadata request for a missing topic
        # lets a broker with auto.create.topics.enable create it with 1 partition.
        present = set(await admin.list_topics())
        existing = await admin.describe_topics([t for t in wanted if t in present]) if present & set(wanted) else []
        counts = {t["topic"]: len(t["partitions"]) for t in existing if t.get("error_code", 0) == 0 and t["partitions"]}
        missing = [name for name in wanted if name not in counts]
        if missing:
            try:
                await admin.create_topics([
                    NewTopic(name, config.partitions, config.replication,
                             topic_configs=COMPACTED if name == config.changelog_topic else {})
                    for name in missing
                ])
            except KafkaError as exc:  # another worker may have created them meanwhile
                if "TopicAlreadyExists" not in type(exc).__name__:
                    raise
            for name in missing:
                counts[name] = config.partitions
        co = {name: counts[name] for name in (config.steps_topic, config.outcomes_topic, config.ticks_topic,
                                             config.changelog_topic)}
        if len(set(co.values())) != 1:
            raise TopicLayoutError(
                "input topics must be co-partitioned (same partition count), got "
                + ", ".join(f"{k}={v}" for k, v in co.items())
            )
        if co[config.steps_topic] != config.partitions:
            raise TopicLayoutError(
                f"{config.steps_topic} has {co[config.steps_topic]} partitions but partitions={config.partitions}; "
                "set LOOPWARDEN_PARTITIONS to the existing count"
            )
    finally:
        await admin.close()


class Router:
    """Which partition an output goes to when its stage leaves it to the default partitioner.

    The partition counts of the output topics are learned once a producer is up
    (:meth:`learn`); a topic keyed like the inputs with their partition count maps
    partition *i*'s outputs to *i* without hashing each key again (the default
    partitioner would pick the same)."""

    def __init__(self, input_partitions: int, keyed_like_input: frozenset[str] = frozenset()) -> None:
        self.input_partitions = input_partitions
        self.keyed_like_input = keyed_like_input
        self.counts: dict[str, int] = {}

    async def learn(self, producer, topics) -> None:
        for topic in topics:
            self.counts[topic] = len(await producer.partitions_for(topic))

    def partition(self, topic: str, key: bytes | None, p: int) -> int:
        n = self.counts[topic]
        if n == self.input_partitions and topic in self.keyed_like_input:
            return p
        return partition_of(key, n) if key is not None else p % n
