"""Group assignment: co-partitioned inputs, and who owns which partition (for routed reads).

Each member advertises its URL in its subscription's user data. The group leader
gives every member the same partition numbers of every input topic (partition *i*
of agent.steps, agent.outcomes and the ticks topic go together: a run's state, its
steps and its receipts live on one partition number), in contiguous ranges over the
members sorted by id, and hands every member the whole partition -> URL map in the
assignment's user data, so any worker can forward ``GET /runs/{id}`` to the owner.

Each member also advertises the output partition counts it holds the layout to (what the
outputs had when it first owned partitions), and the leader hands the group's (the count most
members hold, the larger on a tie) to every member: a worker that joins while an output was
deleted and auto-created with another count is held to the group's count, not to the new one,
and stays blocked with the others until the output is mended (loopwarden.engine.layoutguard).

This uses aiokafka's public assignor interface (``AbstractPartitionAssignor``).
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import Iterable, Mapping

from aiokafka.coordinator.assignors.abstract import AbstractPartitionAssignor
from aiokafka.coordinator.protocol import (
    ConsumerProtocolMemberAssignment,
    ConsumerProtocolMemberMetadata,
)
from murmurhash2 import murmurhash2

log = logging.getLogger("loopwarden.assignment")

# Kafka's default partitioner hashes a key with MurmurHash2 (32-bit) seeded 0x9747B28C (Java's ``Utils.murmur2``):
# murmurhash2's, in native code, 0.3 µs for a 40-byte run id where the same arithmetic in Python took 2.0-5.2 µs
# (aiokafka's own, byte by byte: 5.5). The health stage hashes the first record of each run it sees
# (``Placement.judge``: 2.6 % of the worker's CPU on the ingest bench in Python), the bridge's router every
# event's run id. tests/unit/test_otel_fast_paths.py checks it against aiokafka's on generated keys.
_SEED = 0x9747B28C


def murmur2(data: bytes) -> int:
    """Kafka's murmur2 of ``data``, unsigned: what ``aiokafka.partitioner.murmur2`` returns."""
    return murmurhash2(data, _SEED)


def partition_of(key: bytes, partitions: int) -> int:
    """The partition the Java-compatible default partitioner (aiokafka, kafkajs, Java) picks for ``key``."""
    return (murmurhash2(key, _SEED) & 0x7FFFFFFF) % partitions  # murmur2(key), its call inline


def split(partitions: int, members: list[str]) -> dict[str, list[int]]:
    """Contiguous ranges of partition numbers over ``members`` (sorted), the first ones one larger."""
    members = sorted(members)
    per, extra = divmod(partitions, len(members))
    out, start = {}, 0
    for i, member in enumerate(members):
        n = per + (1 if i < extra else 0)
        out[member] = list(range(start, start + n))
        start += n
    return out


class CoPartitionedAssignor(AbstractPartitionAssignor):
    """Range-style assignment of partition *numbers* across all subscribed topics, plus an owner map."""

    name = "loopwarden-copartitioned"
    version = 1

    def __init__(self, url: str) -> None:
        self.url = url
        self.owners: dict[int, str] = {}  # partition -> owner URL, from the last assignment
        self.outputs: dict[str, int] = {}  # output topic -> the count this member holds it to (advertised)
        self.group_outputs: dict[str, int] = {}  # ... and the group's, from the last assignment

    def metadata(self, topics: Iterable[str]) -> ConsumerProtocolMemberMetadata:
        data = json.dumps({"url": self.url, "outputs": self.outputs}).encode() if self.outputs else self.url.encode()
        return ConsumerProtocolMemberMetadata(self.version, list(topics), data)

    def assign(self, cluster, members: Mapping[str, ConsumerProtocolMemberMetadata]) -> dict:
        topics = sorted({t for m in members.values() for t in m.subscription})
        counts = {t: len(cluster.partitions_for_topic(t) or ()) for t in topics}
        n = min(counts.values()) if counts else 0
        if len(set(counts.values())) > 1:
            log.error("topics are not co-partitioned: %s; assigning the first %d partitions of each", counts, n)
        ranges = split(n, list(members)) if members and n else {m: [] for m in members}
        advertised = {m: _member(meta.user_data) for m, meta in members.items()}
        owners = {p: advertised[m][0] for m, ps in ranges.items() for p in ps}
        votes: dict[str, Counter] = {}
        for _url, outputs in advertised.values():
            for topic, count in outputs.items():
                votes.setdefault(topic, Counter())[count] += 1
        group = {t: max(c.items(), key=lambda kv: (kv[1], kv[0]))[0] for t, c in votes.items()}
        user_data = json.dumps({"owners": {str(p): url for p, url in owners.items()}, "outputs": group}).encode()
        return {
            member: ConsumerProtocolMemberAssignment(
                self.version, [(t, ranges.get(member, [])) for t in topics], user_data)
            for member in members
        }

    def on_assignment(self, assignment: ConsumerProtocolMemberAssignment) -> None:
        try:
            data = json.loads(assignment.user_data or b"{}")
            if "owners" not in data:  # a leader of an earlier version: the owner map alone
                data = {"owners": data}
            self.owners = {int(p): url for p, url in data["owners"].items()}
            self.group_outputs = {str(t): int(n) for t, n in data.get("outputs", {}).items()}
        except (ValueError, AttributeError, TypeError):
            log.warning("assignment without a readable owner map; reads of other partitions are not routed")
            self.owners = {}


def _member(user_data: bytes | None) -> tuple[str, dict[str, int]]:
    """A member's advertised URL and output counts (a member of an earlier version: its URL alone)."""
    text = (user_data or b"").decode("utf-8", "replace")
    if text.startswith("{"):
        try:
            data = json.loads(text)
            return str(data.get("url", "")), {str(t): int(n) for t, n in (data.get("outputs") or {}).items()}
        except (ValueError, AttributeError, TypeError):
            pass
    return text, {}
