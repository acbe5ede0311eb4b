"""The health stage: step events and outcome receipts in, per-run health transitions out.

Inputs ``agent.steps`` and ``agent.outcomes`` (aligned in event time) and the ticks
topic (moves the event clock, fires due timers); outputs ``agent.health``, keyed by run
id on the input partition; state: each run's :class:`~loopwarden.rules.RunState` in the
``<app id>-runs-changelog``. The fold is :class:`~loopwarden.streams.task.PartitionTask`;
this module declares the stage and records its metrics from what each commit returns.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping

from loopwarden.rules import TIMER_REASONS, Settings
from loopwarden.streams.batch import Batch, wall_clock_ms
from loopwarden.streams.config import Config
from loopwarden.streams.metrics import Metrics
from loopwarden.streams.partition import OwnedPartition
from loopwarden.streams.stage import Input, StageBase
from loopwarden.streams.task import PartitionTask
from loopwarden.streams.topics import ensure_topics
from loopwarden.streams.topology import TopologyWatch


class HealthStage(StageBase):
    name = "health"
    store_name = "runs"

    def __init__(self, config: Config, metrics: Metrics, verifiers=None) -> None:
        self.config = config
        self.metrics = metrics
        self.verifiers = verifiers  # loopwarden.trust.TrustedVerifiers, or None: every receipt counts
        self.settings = Settings(retention_s=config.retention_s, seq_memory_s=config.seq_memory_s)
        self.inputs = (Input(config.steps_topic, "steps"), Input(config.outcomes_topic, "outcomes"),
                       Input(config.ticks_topic, "ticks", tracked=False))
        self.roles = {i.topic: i.role for i in self.inputs}
        self.outputs = (config.health_topic,)
        self.keyed_like_input = frozenset(self.outputs)  # keyed by run id, like the inputs
        self.changelog_topic = config.changelog_topic
        self.deadletter_topic = config.deadletter_topic
        self.punctuate_every_s = config.tick_interval_s

    async def prepare(self) -> None:
        await ensure_topics(self.config)

    def layout_watch(self) -> TopologyWatch:
        return TopologyWatch(self.config)

    def task(self, partition: int, store: Mapping[bytes, bytes]) -> PartitionTask:
        c = self.config
        return PartitionTask(partition, store, self.roles, settings=self.settings, clock=c.clock,
                             max_future_ms=int(c.max_future_skew_s * 1000), health_topic=c.health_topic,
                             verifiers=self.verifiers, partitions=c.partitions,
                             settle=(c.expand_settle_ms, int(c.expand_window_s * 1000), c.max_message_bytes // 2))

    def summary(self, parts: list[OwnedPartition]) -> str:
        return f" ({sum(sum(part.task.state_counts.values()) for part in parts)} runs held)"

    # -- metrics, from what happened ---------------------------------------------------
    def restored(self, part: OwnedPartition) -> None:
        self._count_runs(part.task.state_counts)

    def dropped(self, part: OwnedPartition) -> None:
        self._count_runs(Counter({k: -v for k, v in part.task.state_counts.items()}))

    def committed(self, part: OwnedPartition, result: Batch, summary: Counter) -> None:  # type: ignore[override]
        self._count_runs(summary)  # health -> runs, the batch's delta
        if not result:
            return
        m = self.metrics
        m.count_batch(result.counts)
        now_ms = wall_clock_ms()
        for t in result.transitions:
            m.child(m.transitions, t.from_state or "none", t.to_state).inc()
            m.child(m.agent_transitions, m.agent_label(t.agent), t.to_state).inc()
            (m.timer_latency if t.reason in TIMER_REASONS else m.latency).observe(max(0.0, (now_ms - t.ts) / 1000))

    def aborted(self, part: OwnedPartition, result: Batch) -> None:  # type: ignore[override]
        m = self.metrics
        for key, n in result.counts.items():
            if key[0] == "event" and key[1] != "ticks":
                m.child(m.redelivered, key[1]).inc(n)

    def _count_runs(self, delta: Mapping) -> None:
        m = self.metrics
        for state, n in delta.items():
            if state is not None and n:
                m.child(m.runs, state).inc(n)
