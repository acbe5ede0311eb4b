"""Topic layout: check it before creating anything, create what is missing, mend what does not fit.

The inputs (steps, outcomes, and the verifiers' outcomes topic when set), the ticks topic and the changelog must have one partition count, the
configured one: partition i of each belongs to the worker that owns partition i. The layout is
checked first and nothing is created when it does not fit, so a wrong setting leaves no topic
behind; the error is one line saying what to run. ``loopwarden topics check`` shows the layout and
``loopwarden topics repair`` creates what is missing and recreates co-partitioned topics of the
wrong count that hold no records.

The OpenTelemetry bridge's topics (:func:`otel_topics`) are a layout of their own, ``otel_partitions`` each.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import TopicAlreadyExistsError, for_code

from loopwarden.engine.config import Config
from loopwarden.engine.exceptions import TopicLayoutError
from loopwarden.engine.security import client_options

# The changelog keeps each run's last state: compaction drops older ones, tombstones go after a day.
COMPACTED = {"cleanup.policy": "compact", "delete.retention.ms": "86400000"}


def inputs(config: Config) -> list[str]:
    """The input topics keyed by run id: steps, outcomes, and the verifiers' own outcomes topic when set."""
    verified = config.trusted_outcomes_topic
    return [config.steps_topic, config.outcomes_topic, *([verified] if verified else [])]


def co_partitioned(config: Config) -> list[str]:
    """The topics that must share the configured partition count."""
    return [*inputs(config), config.ticks_topic, config.changelog_topic]


def outputs(config: Config) -> list[str]:
    """The topics the worker produces to: any partition count, but the one they had at start while it runs."""
    return [config.health_topic, config.deadletter_topic, config.actions_topic]


def wanted(config: Config) -> list[str]:
    return [*inputs(config), config.ticks_topic, config.health_topic, config.deadletter_topic, config.actions_topic,
            config.changelog_topic]


def otel_topics(config: Config) -> list[str]:
    """The Collector's topic and the bridge's changelog (its stage's app id is ``<app id>-otel``)."""
    return [config.otel_topic, f"{config.app_id}-otel-traces-changelog"]


def otel_problem(partitions: int, counts: dict[str, int]) -> str:
    """One line: the bridge's topics have ``counts``, not ``partitions`` each; what to run."""
    ns = set(counts.values())
    keep = f"set LOOPWARDEN_OTEL_PARTITIONS={min(ns)} to use them as they are, or " if len(ns) == 1 else ""
    return (f"the bridge's topics must have otel_partitions={partitions} partitions each, got "
            + ", ".join(f"{t}={n}" for t, n in counts.items())
            + f": {keep}run `loopwarden topics repair --otel` (it recreates those holding no records)")


def expected(config: Config, topic: str) -> int:
    """The partition count ``topic`` is created with."""
    return config.otel_partitions if topic in otel_topics(config) else config.partitions


@dataclass
class Layout:
    """What the broker has of the wanted topics, and what does not fit the config."""

    config: Config
    counts: dict[str, int]  # existing topic -> partitions
    missing: list[str] = field(default_factory=list)
    wrong: dict[str, int] = field(default_factory=dict)  # co-partitioned topic -> its (wrong) count
    # output topic -> its count, when not the configured one (allowed: a worker keeps the count an output had at
    # its start; but one auto-created by the broker while workers ran blocks them: `topics repair` recreates it)
    outputs_off: dict[str, int] = field(default_factory=dict)
    otel: bool = False  # the bridge's topics are part of it
    otel_wrong: dict[str, int] = field(default_factory=dict)  # otel topic -> its count, not otel_partitions

    @property
    def ok(self) -> bool:
        return not self.wrong and not self.otel_wrong

    topics = property(lambda self: wanted(self.config) + (otel_topics(self.config) if self.otel else []))

    def problem(self) -> str:
        """One line: what does not fit, and what to run."""
        otel = {t: self.counts[t] for t in otel_topics(self.config) if t in self.counts}
        return "; ".join(([self._problem()] if self.wrong else [])
                         + ([f"topic layout: {otel_problem(self.config.otel_partitions, otel)}"] if self.otel_wrong else []))

    def _problem(self) -> str:
        c = self.config
        shown = ", ".join(f"{t} has {n}" for t, n in self.wrong.items())
        existing = {self.counts[t] for t in co_partitioned(c) if t in self.counts}
        if len(existing) == 1 and set(self.wrong) == {t for t in co_partitioned(c) if t in self.counts}:
            (n,) = existing
            return (f"topic layout: {shown} partitions but partitions={c.partitions}: run with --partitions {n} "
                    f"(LOOPWARDEN_PARTITIONS={n}) to use them as they are")
        counts = ", ".join(f"{t}={self.counts[t]}" for t in co_partitioned(c) if t in self.counts)
        *rest, last = co_partitioned(c)
        grown = max(existing)
        return (f"topic layout: {', '.join(rest)} and {last} must have the same partition count, got {counts}: "
                f"if a topic was grown, stop every worker and run `loopwarden topics expand --to {grown}` (then "
                f"start them with --partitions {grown}); else run `loopwarden topics repair --partitions N` with the "
                f"count to keep (`loopwarden topics check` shows the layout)")


def _admin(config: Config, timeout_s: float) -> AIOKafkaAdminClient:
    return AIOKafkaAdminClient(**client_options(config), request_timeout_ms=int(timeout_s * 1000))


async def existing_counts(admin: AIOKafkaAdminClient, names: list[str]) -> dict[str, int]:
    """Partition counts of those of ``names`` that exist (never creates one)."""
    # Describe only topics that exist: a metadata request for a missing topic lets a broker with
    # auto.create.topics.enable create it with its default partition count.
    present = set(await admin.list_topics())
    asked = [t for t in names if t in present]
    existing = await admin.describe_topics(asked) if asked else []
    return {t["topic"]: len(t["partitions"]) for t in existing if t.get("error_code", 0) == 0 and t["partitions"]}


def plan(config: Config, counts: dict[str, int], otel: bool = False) -> Layout:
    """The layout of ``counts`` against ``config``: missing topics, and co-partitioned ones of another count
    (with ``otel``, the bridge's topics too)."""
    layout = Layout(config, counts, otel=otel)
    layout.missing = [t for t in layout.topics if t not in counts]
    if otel:
        layout.otel_wrong = {t: counts[t] for t in otel_topics(config)
                             if t in counts and counts[t] != config.otel_partitions}
    layout.wrong = {t: counts[t] for t in co_partitioned(config) if t in counts and counts[t] != config.partitions}
    layout.outputs_off = {t: counts[t] for t in outputs(config) if t in counts and counts[t] != config.partitions}
    return layout


async def partition_count(config: Config, topic: str, timeout_s: float = 30) -> int | None:
    """How many partitions ``topic`` has; None when it does not exist (never creates it)."""
    admin = _admin(config, timeout_s)
    await admin.start()
    try:
        return (await existing_counts(admin, [topic])).get(topic)
    finally:
        await admin.close()


async def read_layout(config: Config, timeout_s: float = 30, otel: bool = False) -> Layout:
    """The layout; with ``otel``, the bridge's topics are part of it."""
    admin = _admin(config, timeout_s)
    await admin.start()
    try:
        return plan(config, await existing_counts(admin, wanted(config) + (otel_topics(config) if otel else [])), otel)
    finally:
        await admin.close()


async def _create(admin: AIOKafkaAdminClient, config: Config, names: list[str]) -> None:
    """Create ``names`` with the configured count; one that exists already (another worker) is fine."""
    if not names:
        return
    changelogs = {config.changelog_topic, otel_topics(config)[1]}
    response = await admin.create_topics([
        NewTopic(name, expected(config, name), config.replication,
                 topic_configs=COMPACTED if name in changelogs else {})
        for name in names
    ])
    for topic, code, *rest in response.topic_errors:
        if code not in (0, TopicAlreadyExistsError.errno):
            message = rest[0] if rest and rest[0] else for_code(code).__name__
            raise TopicLayoutError(f"cannot create topic {topic}: {message}")


async def ensure_topics(config: Config, timeout_s: float = 30) -> None:
    """Check the layout, then create the missing topics; refuse (creating nothing) when it does not fit."""
    admin = _admin(config, timeout_s)
    await admin.start()
    try:
        layout = plan(config, await existing_counts(admin, wanted(config)))
        if not layout.ok:
            raise TopicLayoutError(layout.problem())
        await _create(admin, config, layout.missing)
        after = plan(config, await existing_counts(admin, wanted(config)))  # another process may have raced us
        if not after.ok:
            raise TopicLayoutError(after.problem())
    finally:
        await admin.close()


async def holds_records(config: Config, topic: str, partitions: int) -> bool:
    """Whether any partition of ``topic`` holds a record (end offset past its beginning)."""
    return await records_held(config, topic, partitions) > 0


async def records_held(config: Config, topic: str, partitions: int) -> int:
    """How many offsets ``topic`` holds (end minus beginning, all partitions; transaction markers count too)."""
    from aiokafka import AIOKafkaConsumer, TopicPartition

    consumer = AIOKafkaConsumer(**client_options(config), group_id=None, enable_auto_commit=False)
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        begin, end = await consumer.beginning_offsets(tps), await consumer.end_offsets(tps)
        return sum(end[tp] - begin[tp] for tp in tps)
    finally:
        await consumer.stop()


async def repair_plan(config: Config, timeout_s: float = 30,
                      otel: bool = False) -> tuple[Layout, list[str], list[str], dict[str, int]]:
    """The layout, the wrong-count topics that are empty (safe to recreate), those that hold records, and
    the outputs of another count than configured -> the records they hold (0: safe to recreate)."""
    layout = await read_layout(config, timeout_s, otel=otel)
    empty, full = [], []
    for topic, n in {**layout.wrong, **layout.otel_wrong}.items():
        (full if await holds_records(config, topic, n) else empty).append(topic)
    held = {topic: await records_held(config, topic, n) for topic, n in layout.outputs_off.items()}
    return layout, empty, full, held


async def repair(config: Config, recreate: list[str], timeout_s: float = 30, attempts: int = 5,
                 otel: bool = False) -> list[str]:
    """Delete ``recreate`` (wrong count, empty or given up), create them and every missing topic with the
    configured count right after, and check the counts they came back with.

    A client asking for a deleted topic's metadata in between (a running worker's producer) makes a broker
    with auto.create.topics.enable create it again with its default count: one that came back so, still
    empty, is deleted and created again, up to ``attempts`` times; one that came back holding records is
    never deleted a second time. Returns the topics deleted again so, once per time."""
    admin = _admin(config, timeout_s)
    await admin.start()
    again: list[str] = []
    try:
        for _ in range(attempts):
            await _delete_and_create(admin, config, recreate, timeout_s, otel)
            back = await _settled(admin, config, recreate)
            if not back:
                return again
            held = {t: await records_held(config, t, n) for t, n in back.items()}
            if any(held.values()):
                raise TopicLayoutError(
                    "; ".join(f"{t} came back with {back[t]} partitions holding records ({n} offsets)"
                              for t, n in held.items() if n)
                    + " between repair's delete and create (auto-created by a client writing it): stop its writers, "
                    "then `loopwarden topics check` and repair again")
            recreate = list(back)  # auto-created by a client, still empty: once more
            again += recreate
        raise TopicLayoutError(
            ", ".join(f"{t} ({n} partitions)" for t, n in back.items())
            + f" came back with the broker's default count on each of {attempts} attempts: a client asks for "
            "them between repair's delete and create and the broker auto-creates them "
            "(auto.create.topics.enable); stop the workers, or set auto.create.topics.enable=false, and repair again")
    finally:
        await admin.close()


async def _delete_and_create(admin: AIOKafkaAdminClient, config: Config, recreate: list[str],
                             timeout_s: float, otel: bool = False) -> None:
    """Delete ``recreate``, then create it and every missing topic at once (the controller has dropped a
    topic when its delete returns), and wait until a broker lists them."""
    names = wanted(config) + (otel_topics(config) if otel else [])
    layout = plan(config, await existing_counts(admin, names), otel=otel)
    names = [*layout.missing, *(t for t in recreate if t not in layout.missing)]
    if recreate:  # the create follows at once: the shorter the gap, the fewer clients can auto-create in it
        await admin.delete_topics(recreate, timeout_ms=int(timeout_s * 1000))
    for _ in range(50):  # a topic just deleted can be refused for a moment
        try:
            await _create(admin, config, names)
            break
        except TopicLayoutError:
            await asyncio.sleep(0.2)
    else:
        await _create(admin, config, names)
    deadline = time.monotonic() + timeout_s  # the brokers learn of new topics a moment after the controller
    while set(names) - set(await admin.list_topics()):
        if time.monotonic() > deadline:
            raise TopicLayoutError(f"topics {names} were created but not listed after {timeout_s:.0f}s")
        await asyncio.sleep(0.1)


async def _settled(admin: AIOKafkaAdminClient, config: Config, names: list[str], wait_s: float = 3) -> dict[str, int]:
    """Those of ``names`` whose count is not the configured one after ``wait_s`` (a broker's view of a topic
    deleted and created again can show the old one for a moment) -> the count they have.

    A topic listed but not yet described with its partitions (a broker still applying a deletion and a creation)
    is not settled: read again, it may show the count a client's auto-create gave it."""
    deadline = time.monotonic() + wait_s
    while True:
        counts = await existing_counts(admin, names)
        off = {t: counts[t] for t in names if t in counts and counts[t] != expected(config, t)}
        unseen = [t for t in names if t not in counts]
        if not off and not unseen:
            return off
        if time.monotonic() > deadline:
            if unseen:
                raise TopicLayoutError(f"topics {unseen} were created but a broker did not describe their partitions "
                                       f"within {wait_s:g} s: run `loopwarden topics check`, then repair again")
            return off
        await asyncio.sleep(0.1)
