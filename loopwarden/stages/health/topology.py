"""The topic layout, watched while the worker runs (not only checked at start).

Partition *i* of every input topic (steps, outcomes, ticks) and of the changelog belongs to
the worker that owns partition *i*: a run's state, its steps and its receipts meet there
only while all of them have the same partition count the worker was started with. An
operator who adds partitions to one of them (the usual way to scale a Kafka topic) makes
producers hash a run's new events to another partition than its state and its receipts:
nothing fails, verdicts just go wrong. So the worker re-reads the layout every
``topology_check_s`` and whenever the group rebalances (a partition-count change of a
subscribed topic triggers one), and :func:`assess` decides what it may still do:

- ``fold``: the co-partitioned topics all have ``partitions``; otherwise the worker folds
  nothing at all (any partition may now receive events of runs whose state is elsewhere);
- ``produce``: each output topic (health, dead letters) exists with the partition count it had
  when the worker started; a deleted topic re-created by the broker's auto-create with one
  partition would leave transactions waiting for partitions that no longer exist.

The worker holds processing while either is false, says why in one log line, a metric and
``/readyz``, and resumes by itself once the layout is right again. Reading the layout never
creates a topic: missing topics are listed first, only existing ones described.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import msgspec
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

from loopwarden.engine.assignment import partition_of
from loopwarden.stages.health.config import HealthConfig
from loopwarden.engine.security import client_options
from loopwarden.stages.topics import co_partitioned, existing_counts, outputs


@dataclass(frozen=True)
class Verdict:
    """What the layout allows: fold inputs, produce outputs; one line per problem (empty when fine)."""

    fold: bool
    produce: bool
    problems: tuple[str, ...] = field(default=())

    @property
    def ok(self) -> bool:
        return self.fold and self.produce

    def reason(self) -> str:
        return "; ".join(self.problems)


LAYOUT_KEY = b"\xffloopwarden/layout"


class Expansion(msgspec.Struct, frozen=True):
    """The layout record of one changelog partition: what an expansion left for the worker."""

    partitions: int  # the count after the expansion
    previous: int  # the count before it
    # input topic -> the end offset of this partition when the expansion copied its waiting events
    # (only on partitions that existed before)
    boundary: dict[str, int] = {}
    # when the expansion wrote it (wall clock ms; 0 in records of earlier versions): moved runs' records
    # settle on their new partition for expand_window_s from then (loopwarden.stages.health.settle)
    at_ms: int = 0


encode_expansion = msgspec.msgpack.Encoder().encode
decode_expansion = msgspec.msgpack.Decoder(Expansion).decode


class Placement:
    """Where a record of a run that a partition does not hold belongs (its run's first record, mostly).

    Only such records need hashing: a run's later records find its state. One that hashes to
    another partition is ``wrong_partition`` (a producer with another partitioner: folded here it
    would start a second life of its run) unless an expansion explains it: ``copied`` to its new
    partition by ``topics expand`` (below the boundary: skip it), or ``forwarded`` (a producer
    that still hashes over the old count: send it to its partition in the same transaction)."""

    def __init__(self, partition: int, partitions: int) -> None:
        self.partition = partition
        self.partitions = partitions
        self.expansion: Expansion | None = None  # the partition's layout record, after an expansion

    def judge(self, key: bytes, topic: str, offset: int) -> tuple[str, int] | None:
        """None: it belongs here; else (``copied`` | ``forwarded`` | ``wrong_partition``, its partition)."""
        target = partition_of(key, self.partitions)
        p = self.partition
        if target == p:
            return None
        x = self.expansion
        if x is not None and p < x.previous and partition_of(key, x.previous) == p:
            return ("copied" if offset < x.boundary.get(topic, 0) else "forwarded"), target
        return "wrong_partition", target

    def wrong(self, key: bytes, topic: str, target: int) -> str:
        return (f"key {key[:80]!r} hashes to partition {target} of {topic} ({self.partitions} partitions), "
                f"not {self.partition}: does its producer use another partitioner?")


def assess(config: HealthConfig, counts: Mapping[str, int], expected_outputs: Mapping[str, int]) -> Verdict:
    """Judge a layout read from the cluster.

    ``counts``: topic -> partition count, for the topics that exist. ``expected_outputs``:
    output topic -> the count it had when the worker started producing to it.
    """
    problems: list[str] = []
    fold = True
    for topic in co_partitioned(config):
        n = counts.get(topic)
        if n is None:
            fold = False
            problems.append(f"{topic} is missing (expected {config.partitions} partitions)")
        elif n != config.partitions:
            fold = False
            problems.append(
                f"{topic} has {n} partition{'' if n == 1 else 's'}, expected {config.partitions}: co-partitioning is broken "
                f"(grow all input topics together with `loopwarden topics expand`)")
    produce = True
    for topic in outputs(config):
        n = counts.get(topic)
        want = expected_outputs.get(topic)
        if n is None:
            produce = False
            problems.append(f"{topic} is missing")
        elif want is not None and n != want:
            produce = False
            problems.append(
                f"{topic} has {n} partition{'' if n == 1 else 's'}, it had {want} when this worker started "
                f"(deleted and re-created? delete it and create it with {want} partitions; "
                f"set auto.create.topics.enable=false on the brokers)")
    return Verdict(fold=fold, produce=produce, problems=tuple(problems))


class TopologyWatch:
    """Reads the layout through one admin client of its own and keeps the last verdict."""

    def __init__(self, config: HealthConfig) -> None:
        self.config = config
        self.expected_outputs: dict[str, int] = {}
        self.adopt_outputs = False  # once assigned: a reading fixes the outputs' counts if the group has none
        self.verdict = Verdict(fold=True, produce=True)
        self._admin: AIOKafkaAdminClient | None = None

    async def start(self) -> None:
        self._admin = AIOKafkaAdminClient(**client_options(self.config), request_timeout_ms=10_000)
        await self._admin.start()

    async def stop(self) -> None:
        if self._admin is not None:
            await self._admin.close()
            self._admin = None

    async def check(self) -> tuple[Verdict, bool]:
        """Read the layout, judge it; returns the verdict and whether it differs from the last one."""
        assert self._admin is not None, "TopologyWatch.start() first"
        c = self.config
        counts = await existing_counts(self._admin, [*co_partitioned(c), *outputs(c)])
        if not self.expected_outputs and self.adopt_outputs:  # the first reading once assigned fixes them
            self.expected_outputs = {t: counts[t] for t in outputs(c) if t in counts}
        verdict = assess(c, counts, self.expected_outputs)
        changed = verdict != self.verdict
        self.verdict = verdict
        return verdict, changed

    def hold_to(self, group: Mapping[str, int]) -> None:
        """Partitions were assigned: hold the outputs to the group's counts (loopwarden.engine.assignment),
        or, in a group that has none yet, to the counts the next reading finds."""
        if group:
            self.expected_outputs = dict(group)
        self.adopt_outputs = True

    async def auto_create_enabled(self) -> bool | None:
        """The brokers' ``auto.create.topics.enable`` (None when it cannot be read)."""
        assert self._admin is not None, "TopologyWatch.start() first"
        try:
            cluster = await self._admin.describe_cluster()
            answers = await self._admin.describe_configs([
                ConfigResource(ConfigResourceType.BROKER, str(b["node_id"]), {"auto.create.topics.enable": None})
                for b in cluster["brokers"][:1]])
        except Exception:  # noqa: BLE001 - a permission or version gap: unknown, not fatal
            return None
        for answer in answers:
            for resource in answer.to_object()["resources"]:
                for entry in resource["config_entries"]:
                    if entry["config_names"] == "auto.create.topics.enable":
                        return entry["config_value"] == "true"
        return None
