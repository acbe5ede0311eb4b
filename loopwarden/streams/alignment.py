"""Stream-time alignment of a partition's tracked inputs (Kafka Streams ``PartitionGroup.readyToProcess``).

A task that merges two inputs in event time (steps and receipts) must not apply a
record of one input stamped later than everything the other has shown while that
other input still holds records on the broker: they would meet out of order. The
task holds such records back (``Task.holding``); this class tells it which inputs
lag (their consumed position is short of the end: the last stable offset), and after
``max_idle_ms`` of holding it lets the fold go on without waiting (``max.task.idle.ms``).
"""

from __future__ import annotations

import time

from aiokafka import AIOKafkaConsumer, TopicPartition


class Alignment:
    """One partition's view of its tracked inputs: which lag, whether its task has held records too long."""

    def __init__(self, consumer: AIOKafkaConsumer, partition: int, roles: dict[str, str], max_idle_ms: int) -> None:
        self.consumer = consumer
        self.tps = {topic: TopicPartition(topic, partition) for topic in roles}
        self.roles = roles  # tracked input topic -> role
        self.max_idle_s = max_idle_ms / 1000
        self.enabled = max_idle_ms > 0
        self.holding_since: float | None = None  # monotonic time the task began holding records back

    def overdue(self, now: float | None = None) -> bool:
        """The task has held records for ``max_idle_ms``: fold them now, the lagging input notwithstanding."""
        since = self.holding_since
        return since is not None and (time.monotonic() if now is None else now) - since >= self.max_idle_s

    async def lagging(self, records: list) -> tuple[bool, set[str]]:
        """Whether every tracked input is consumed to its end with ``records``, and the roles known to hold more."""
        last: dict[str, int] = {}
        for r in records:
            last[r.topic] = r.offset + 1
        consumer = self.consumer
        known = True
        lagging: set[str] = set()
        for topic, tp in self.tps.items():
            end = consumer.last_stable_offset(tp)
            if end is None:
                end = consumer.highwater(tp)
            if end is None:
                known = False
                continue
            pos = last.get(topic)
            if pos is None:
                pos = await consumer.position(tp)
            if pos < end:
                lagging.add(self.roles[topic])
        return known and not lagging, lagging

    def wait_for(self, lagging: set[str], overdue: bool) -> set[str]:
        """The lagging roles the task should wait for in this fold (none once overdue or when disabled)."""
        return lagging if self.enabled and not overdue else set()

    def folded(self, holding: int) -> None:
        """After a fold: start (or keep) the idle clock while the task holds records, stop it when it holds none."""
        if not holding:
            self.holding_since = None
        elif self.holding_since is None:
            self.holding_since = time.monotonic()
