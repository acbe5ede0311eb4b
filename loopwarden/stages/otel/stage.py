"""The OpenTelemetry bridge as a stage on the engine: ``otlp_spans`` in, run events on ``agent.steps`` out.

Input ``otlp_spans`` (one trace per message, keyed by trace id: the Collector's Kafka
exporter with ``partition_traces_by_id``); outputs the contract's step events, keyed by
run id, on ``agent.steps`` through the default partitioner (so each run's events land on
the partition the health stage expects); state: each trace's
:class:`~loopwarden.stages.otel.fold.TraceState` in ``<app id>-otel-traces-changelog``, partitioned
like ``otlp_spans``. The fold is :class:`~loopwarden.stages.otel.task.BridgeTask`; the engine
commits its outputs, changelog and offsets in one transaction per batch (exactly-once,
like the health stage), under its own consumer group and transactional ids
(``<app id>-otel``), so the bridge scales apart from the workers.

The bridge's :class:`~loopwarden.stages.otel.config.OtelConfig` is the process's with ``app_id`` =
``<app id>-otel`` and ``partitions`` = ``otel_partitions`` (:func:`bridge_config`); where its run events go
(:class:`~loopwarden.stages.otel.config.RunEvents`) is the health stage's setting, handed to it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TypeVar

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaError

from loopwarden.stages.otel.fold import Limits
from loopwarden.stages.otel.task import PUNCTUATE_S, BridgeTask, Folded
from loopwarden.engine.exceptions import TopicLayoutError
from loopwarden.stages.otel.metrics import OtelMetrics
from loopwarden.engine.security import client_options
from loopwarden.engine.stage import Input, StageBase
from loopwarden.engine.recovery import COMPACTED
from loopwarden.stages.otel.config import OtelConfig, RunEvents, otel_problem

OtelT = TypeVar("OtelT", bound=OtelConfig)


def bridge_config(config: OtelT) -> OtelT:
    """The engine's configuration for the bridge: its own group and transactional ids, its own partition count."""
    return dataclasses.replace(config, app_id=f"{config.app_id}-otel", partitions=config.otel_partitions)


class BridgeStage(StageBase[BridgeTask, Folded]):
    name = "otel"
    store_name = "traces"

    def __init__(self, config: OtelConfig, metrics: OtelMetrics, events: RunEvents) -> None:
        """``config``: the bridge's own (:func:`bridge_config`); ``events``: where its run events go."""
        self.config, self.events = config, events
        self.metrics = metrics
        self.inputs = (Input(config.otel_topic, "spans"),)
        self.outputs = (events.steps_topic,)
        self.changelog_topic = f"{config.app_id}-traces-changelog"
        self.deadletter_topic = events.deadletter_topic
        # Often, so that a run held for its end grace goes out soon after it is due: a punctuation with
        # nothing due costs the task one comparison and commits nothing.
        self.punctuate_every_s = min(config.tick_interval_s, PUNCTUATE_S)
        self.limits = Limits(end_grace_s=config.otel_end_grace_s)

    async def prepare(self) -> None:
        """Create ``otlp_spans`` and the bridge's changelog if missing; refuse them unless co-partitioned.

        The layout is checked before anything is created: a refused layout leaves no topic behind, so the
        count the refusal names (LOOPWARDEN_OTEL_PARTITIONS) is the one that then works."""
        c = self.config
        admin = AIOKafkaAdminClient(**client_options(c), request_timeout_ms=30_000)
        await admin.start()
        try:
            wanted = [c.otel_topic, self.changelog_topic]
            present = set(await admin.list_topics())  # describe only what exists: no auto-creation
            existing = await admin.describe_topics([t for t in wanted if t in present]) if present & set(wanted) else []
            counts = {t["topic"]: len(t["partitions"]) for t in existing if t.get("error_code", 0) == 0}
            steps = self.events.steps_topic
            if steps not in present:
                raise TopicLayoutError(f"{steps} is missing: start a worker once (it creates the topics), "
                                       "or run `loopwarden topics repair`")
            self._check(counts)
            missing = [t for t in wanted if t not in counts]
            if missing:
                try:
                    await admin.create_topics([
                        NewTopic(t, c.partitions, c.replication,
                                 topic_configs=COMPACTED if t == self.changelog_topic else {}) for t in missing])
                except KafkaError as exc:  # another bridge may have created them meanwhile
                    if "TopicAlreadyExists" not in type(exc).__name__:
                        raise
                existing = await admin.describe_topics(wanted)
                self._check({t["topic"]: len(t["partitions"]) for t in existing
                             if t.get("error_code", 0) == 0 and t["partitions"]})
        finally:
            await admin.close()

    def _check(self, counts: dict[str, int]) -> None:
        if set(counts.values()) - {self.config.partitions}:
            raise TopicLayoutError(otel_problem(self.config.partitions, counts))

    def task(self, partition: int, store: Mapping[bytes, bytes]) -> BridgeTask:
        c = self.config
        return BridgeTask(partition, store, steps_topic=self.events.steps_topic, limits=self.limits,
                          max_message_bytes=c.max_message_bytes, max_future_ms=int(self.events.max_future_skew_s * 1000),
                          expire_every_ms=int(c.tick_interval_s * 1000))

    def summary(self, tasks: list[BridgeTask]) -> str:
        return f" ({sum(task.traces for task in tasks)} traces held)"

    # -- metrics, from what happened ---------------------------------------------------
    def committed(self, partition: int, task: BridgeTask, result: Folded, summary: object) -> None:
        m = self.metrics
        m.otel_traces.labels(str(partition)).set(task.traces)
        for key, n in result.counts.items():
            kind = key[0]
            if kind == "otel":
                m.child(m.otel_spans, key[1]).inc(n)
            elif kind == "otel_event":
                m.child(m.otel_events, key[1]).inc(n)
            elif kind == "invalid":
                m.child(m.invalid, "spans", key[2]).inc(n)

    def dropped(self, partition: int, task: BridgeTask) -> None:
        try:
            self.metrics.otel_traces.remove(str(partition))
        except KeyError:
            pass
