"""The engine's one switch over the fetch of its input partitions: paused while any reason holds one.

Three parts of the engine stop fetching input partitions, each for a reason of its own:

- ``dropped``: a partition given up after a failure or a fence stays assigned and is not fetched
  until it is owned again (``PartitionManager.drop``, then ``own``);
- ``layout``: the topic layout broke co-partitioning, and nothing is fetched until it is right
  (``loopwarden.engine.layoutguard``);
- ``ahead``: a task holds so many records of an input that runs ahead in stream time (``HOLD_MAX``, or
  ``input_buffer_max_bytes`` filled) that it may hold no more; that input waits on the broker until
  the other one has caught up (``loopwarden.engine.alignment``; Kafka Streams pauses a partition
  whose buffer is full, ``buffered.records.per.partition``).

Each part pauses and resumes only its own reason; a partition is fetched again once no reason is
left, so one part's resume never undoes another's pause. aiokafka's pause lasts one assignment (a
rebalance fetches every partition again): :meth:`Pauses.assigned` forgets every reason then, and
each part applies its own again (the guard at its check after a rebalance; a partition owned anew
starts with nothing held).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from aiokafka import AIOKafkaConsumer, TopicPartition

REASONS = ("dropped", "layout", "ahead")


class Pauses:
    """Input partition -> why it is paused; the consumer paused while the set is not empty."""

    def __init__(self, series: Callable[[str], object] | None = None) -> None:
        self.consumer: AIOKafkaConsumer | None = None  # set once the engine has made it
        self.why: dict[TopicPartition, set[str]] = {}
        self.series = series  # reason -> its loopwarden_inputs_paused series (None: not counted)

    def pause(self, reason: str, tps: Iterable[TopicPartition]) -> list[TopicPartition]:
        """Pause ``tps`` for ``reason``; those not paused before are returned."""
        assert reason in REASONS, reason
        newly = []
        changed = False
        for tp in tps:
            reasons = self.why.get(tp)
            if reasons is None:
                reasons = self.why[tp] = set()
                newly.append(tp)
            if reason not in reasons:
                reasons.add(reason)
                changed = True
        if newly and self.consumer is not None:
            self.consumer.pause(*newly)
        if changed:
            self._count()
        return newly

    def resume(self, reason: str, tps: Iterable[TopicPartition]) -> list[TopicPartition]:
        """Take ``reason`` off ``tps``; those it was the last reason of are fetched again, and returned."""
        freed = []
        changed = False
        for tp in tps:
            reasons = self.why.get(tp)
            if reasons is None or reason not in reasons:
                continue
            reasons.discard(reason)
            changed = True
            if not reasons:
                del self.why[tp]
                freed.append(tp)
        if freed and self.consumer is not None:
            self.consumer.resume(*freed)
        if changed:
            self._count()
        return freed

    def paused(self, reason: str) -> list[TopicPartition]:
        """The partitions paused for ``reason`` (others may hold them too)."""
        return [tp for tp, reasons in self.why.items() if reason in reasons]

    def assigned(self) -> None:
        """A new assignment: the consumer fetches every partition again, so every reason is forgotten."""
        self.why.clear()
        self._count()

    def _count(self) -> None:
        if self.series is not None:
            for reason in REASONS:
                self.series(reason).set(sum(reason in reasons for reasons in self.why.values()))  # type: ignore[attr-defined]
