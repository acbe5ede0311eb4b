"""Stream-time alignment of a partition's tracked inputs (Kafka Streams ``PartitionGroup.readyToProcess``).

Two halves, one here: :class:`Alignment` is the engine's (which inputs lag, how long the task has held
records, which inputs it paused), :class:`StreamTime` the task's (each input's stream time, which records
to hold back, and the records held).

A task that merges two inputs in event time (steps and receipts) must not apply a record of one input
stamped later than everything the other has shown while that other input still holds records on the
broker: they would meet out of order. The task holds such records back (``Task.holding``); this class
tells it which inputs lag (consumed short of the last stable offset), and after ``max_idle_ms`` lets the
fold go on without waiting (``max.task.idle.ms``). That clock starts again whenever the input waited for
sends records written more than ``max_idle_ms`` ago: it is draining a backlog, not idle (Kafka Streams,
too, counts idle time only while the lagging input has nothing buffered). Fresh records of a live input
do not, so a record stamped ahead of a live input's stream time (a fast producer clock) waits
``max_idle_ms`` at most. A task holding ``HOLD_MAX`` records, or records that fill the worker's
``input_buffer_max_bytes`` with nothing else to fold, holds no more: the inputs it holds records of are
paused (:meth:`Alignment.pause_ahead`, ``loopwarden.engine.pauses``) until it holds none of them, so the
input it waits for catches up and the order is kept (Kafka Streams pauses a partition whose buffer is
full). Only with nothing to pause are they folded without waiting (:meth:`Alignment.give_up`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Collection, Mapping, Sequence
from itertools import islice
from operator import itemgetter

from aiokafka import AIOKafkaConsumer, TopicPartition

from loopwarden.engine.pauses import Pauses
from loopwarden.engine.stage import value_bytes

# Records a partition's task holds for a lagging input at most (the default batch's worth): past it, it pauses.
HOLD_MAX = 20_000
_record_of = itemgetter(0)  # of a (record, decoded) item
log = logging.getLogger("loopwarden.worker")


class Alignment:
    """One partition's view of its tracked inputs: which lag, whether its task has held records too long."""

    def __init__(self, consumer: AIOKafkaConsumer, partition: int, roles: dict[str, str], max_idle_ms: int,
                 pauses: Pauses | None = None) -> None:
        self.consumer = consumer
        self.pauses = pauses  # the engine's one switch over the fetch (None: nothing is paused, records fold as they are)
        self.tps = {topic: TopicPartition(topic, partition) for topic in roles}
        self.roles = roles  # tracked input topic -> role
        self.max_idle_s = max_idle_ms / 1000
        self.enabled = max_idle_ms > 0
        # Monotonic time since which the task has held records and the input it waits for has sent no backlog.
        self.idle_since: float | None = None
        self.full = False  # the task holds more than it may, with no input to pause: fold what it holds now

    def overdue(self, now: float | None = None) -> bool:
        """The task has held records with no backlog from the input it waits for in ``max_idle_ms``, or holds more
        than it may with no input to pause: fold them now, the lagging input notwithstanding."""
        since = self.idle_since
        return self.full or (
            since is not None and (time.monotonic() if now is None else now) - since >= self.max_idle_s)

    async def lagging(self, since: Collection[str]) -> tuple[bool, set[str]]:
        """Whether every tracked input is consumed to its end with the batch just taken, and the roles known to
        hold more. ``since``: the topics of records handed over after the batch (``OwnedPartition.buffered_topics``):
        they hold more. Any other topic is read at the consumer's position: the offset after the last record it
        handed over, and after the transaction markers that follow it (a transactional producer's commit takes an
        offset of its own, and the last stable offset is past it: a batch's own last record is not its end)."""
        consumer = self.consumer
        known = True
        lagging: set[str] = set()
        for topic, tp in self.tps.items():
            end = consumer.last_stable_offset(tp)
            if end is None:
                end = consumer.highwater(tp)
            if end is None:
                known = False
            elif topic in since or await consumer.position(tp) < end:
                lagging.add(self.roles[topic])
        return known and not lagging, lagging

    def wait_for(self, lagging: set[str], overdue: bool) -> set[str]:
        """The lagging roles the task should wait for in this fold (none once overdue or when disabled)."""
        return lagging if self.enabled and not overdue else set()

    def folded(self, holding: int, records: Sequence, fed: Collection[str], waited: Collection[str],
               now: float | None = None, wall_ms: int | None = None, held: Collection[str] = ()) -> None:
        """After a fold of ``records`` (of the topics ``fed``) that waited for the roles ``waited`` and holds
        ``holding`` records of the topics ``held``: resume the inputs paused and not held now; pause those held at
        ``HOLD_MAX``. The idle clock: stopped when nothing is held, started (again) while the input waited for
        drains a backlog (:meth:`draining`). ``now`` (monotonic s), ``wall_ms``: for tests."""
        if self.pauses is not None and self.pauses.why:  # anything paused at all (for any reason, any partition)
            self.resume_ahead(held)
        self.full = holding >= HOLD_MAX and self.pause_ahead(held) is None
        if not holding:
            self.idle_since = None
        elif self.idle_since is None or self.draining(records, fed, waited, wall_ms):
            self.idle_since = time.monotonic() if now is None else now

    def draining(self, records: Sequence, fed: Collection[str], waited: Collection[str],
                 wall_ms: int | None = None) -> bool:
        """Whether the last of ``records`` from an input in ``waited`` was written (its Kafka timestamp) more than
        ``max_idle_ms`` before ``wall_ms``: that input is catching up on a backlog, in as many batches as it takes
        (a pre-loaded one in batches of 50 took over 1 s on a loaded 2-core machine)."""
        topics = {topic for topic in fed if self.roles.get(topic) in waited}
        if not topics:
            return False
        for rec in reversed(records):
            if rec.topic in topics:
                wall = time.time() * 1000 if wall_ms is None else wall_ms
                return rec.timestamp < wall - self.max_idle_s * 1000
        return False

    def pause_ahead(self, held: Collection[str]) -> list[TopicPartition] | None:
        """The task may hold no more: pause the inputs ``held`` names (it holds records of them) until it holds none
        of them. The partitions paused now (those paused already are not again), or None: none can be."""
        tps = [tp for topic, tp in self.tps.items() if topic in held]
        if self.pauses is None or not tps:
            return None
        newly = self.pauses.pause("ahead", tps)
        if newly:
            log.info("partition %d: holding all it may of %s for alignment: paused until the other input caught "
                     "up", tps[0].partition, sorted(tp.topic for tp in newly))
        return newly

    def resume_ahead(self, held: Collection[str] = ()) -> None:
        """Fetch again the inputs paused by :meth:`pause_ahead` that the task holds no record of now (``Pauses``
        keeps which are: a resume of one not paused for this reason changes nothing)."""
        if self.pauses is not None:
            self.pauses.resume("ahead", [tp for topic, tp in self.tps.items() if topic not in held])

    def give_up(self) -> None:
        """Held records fill ``input_buffer_max_bytes`` and no input can be paused: folded as they are next."""
        self.full = True

    def forget(self) -> None:
        """The records buffered and held are dropped (a rebalance): nothing waits, nothing is paused for them."""
        self.idle_since = None
        self.full = False
        self.resume_ahead()


# The roles of the inputs a task merges in event time: steps, receipts, and receipts from the verifiers'
# own topic (LOOPWARDEN_TRUSTED_OUTCOMES_TOPIC, when set). A role without a topic never lags.
ALIGNED = ("steps", "outcomes", "verified_outcomes")


class StreamTime:
    """The task's half of alignment: each aligned input's stream time, and the records held back.

    ``seen_ts``: role -> highest event ts folded (its stream time). ``held``: input topic ->
    ``[(record, decoded)]`` a fold held back, offset order, folded first by the next fold.
    A decoded item is ``(role, event, record)`` (anything else, a dead letter, has no ts).
    ``shown``: role -> highest ts :meth:`limits` has read, held records' included, so that a
    later fold reads only the records new to it: a backlog drained in small batches holds
    thousands of receipts across hundreds of folds (bench e: 2,600 a fold on average)."""

    __slots__ = ("roles", "aligned", "seen_ts", "held", "topic_bytes", "shown", "taken")

    def __init__(self, roles: Mapping[str, str], aligned: tuple[str, ...]) -> None:
        self.roles = roles  # topic -> role
        self.aligned = aligned  # the roles that wait for each other
        self.seen_ts: dict[str, int] = {}
        self.held: dict[str, list] = {}
        self.topic_bytes: dict[str, int] = {}  # input topic -> its held records' values' bytes (see held_bytes)
        self.shown: dict[str, int] = {}
        self.taken: dict[str, int] = {}  # topic -> how many held items the fold began with (read by limits already)

    def take_held(self) -> dict[str, list]:
        held, self.held = self.held, {}
        self.taken = {topic: len(items) for topic, items in held.items()}  # their bytes: still in topic_bytes
        return held

    def discard(self) -> None:
        """The fold's transaction failed: what it held is consumed again, from offsets that stop before it."""
        self.held.clear()
        self.topic_bytes.clear()
        self.shown.clear()
        self.taken = {}

    @property
    def holding(self) -> int:
        return sum(map(len, self.held.values()))

    @property
    def held_bytes(self) -> int:
        """The held records' values' bytes (what input_buffer_max_bytes counts of them)."""
        return sum(self.topic_bytes[topic] for topic in self.held)

    def ready(self, per_topic: dict[str, list], lagging: Collection[str], out) -> dict[str, list]:
        """role -> the decoded items to apply now, offset order per topic; ``per_topic`` as the task decoded it.
        The roles come in ``aligned``'s order (steps, outcomes, verified_outcomes): the task merges them by ``ts``,
        ties to the earlier role, so two events of a partition with one ``ts`` are applied in the same order
        however the fetches cut the batch (docs/contract.md section 5).

        Dead letters go to ``out`` (the fold's :class:`~loopwarden.engine.stage.Folded`) and count as consumed; a topic's records past its limit
        (see :meth:`limits`) are held, with the rest of the topic, for a later fold."""
        limits = self.limits(per_topic, lagging) if lagging else {}
        seen_ts, roles, counts = self.seen_ts, self.roles, out.counts
        inputs: dict[str, list] = {}
        for topic, items in per_topic.items():
            role = roles[topic]
            limit = limits.get(role)
            applied = inputs.get(role)
            if applied is None:
                applied = inputs[role] = []
            high = seen_ts.get(role, -1)
            used = 0
            for _rec, item in items:
                if item.__class__ is not tuple:  # a dead letter
                    out.deadletters.append(item)
                    counts["invalid", role, item.reason] += 1
                else:
                    ts = item[1].ts
                    if limit is not None and ts > limit:  # later than all the lagging topic has shown: wait for it
                        self.held[topic] = items[used:]
                        self._count_held(topic, items, used)
                        break
                    applied.append(item)
                    if ts > high:
                        high = seen_ts[role] = ts
                used += 1
            if topic not in self.held:
                self.topic_bytes.pop(topic, None)
            if used:
                out.consumed += used
                out.offsets[topic] = items[used - 1][0].offset + 1
        if len(inputs) > 1:  # in ALIGNED's order, whichever topic the batch began with: the merge's tie order
            return {role: inputs[role] for role in self.aligned if role in inputs}
        return inputs

    def _count_held(self, topic: str, items: list, used: int) -> None:
        """``items[used:]`` of ``topic`` are held: their bytes, reading only the items new to this fold and those
        applied (the first ``taken`` items were held before: their bytes are in ``topic_bytes``)."""
        start = self.taken.get(topic, 0)
        if used >= start:
            held = _value_bytes(items, used, len(items))
        else:
            held = self.topic_bytes.get(topic, 0) - _value_bytes(items, 0, used) + _value_bytes(items, start, len(items))
        self.topic_bytes[topic] = held

    def limits(self, per_topic: dict[str, list], lagging: Collection[str]) -> dict[str, int]:
        """role -> the latest ts it may apply now: the lowest stream time (highest ts seen, folded, held or in
        this batch) of the other, lagging, aligned inputs, less 1 ms for one that comes first on a tie; -1 (or
        -2) when one of those has shown nothing yet. Held items were read by the fold that held them (``shown``
        has their ts): only those after them are read (tests/unit/test_engine_parts.py checks it against
        reading them all)."""
        stream_ts = dict(self.seen_ts)
        shown, taken = self.shown, self.taken
        for topic, items in per_topic.items():
            role = self.roles[topic]
            high = max(stream_ts.get(role, -1), shown.get(role, -1))
            start = taken.get(topic, 0)
            for _rec, item in islice(items, start, None) if start else items:  # a look-up per topic, not record
                if item.__class__ is tuple:
                    ts = item[1].ts
                    if ts > high:
                        high = ts
            if high >= 0:
                stream_ts[role] = shown[role] = high
        limits = {}
        for i, role in enumerate(self.aligned):
            # A role that comes first on a tie (ready()'s order) may still send a record of its stream time: a
            # record of a later role stamped then waits for it too (one ms less), so ties go the same way
            # across batches as within one.
            others = [stream_ts.get(other, -1) - (j < i) for j, other in enumerate(self.aligned)
                      if other != role and other in lagging]
            if others:
                limits[role] = min(others)
        return limits


def _value_bytes(items: list, start: int, end: int) -> int:
    return value_bytes(map(_record_of, islice(items, start, end)))
