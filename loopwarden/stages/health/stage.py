"""The health stage: step events and outcome receipts in, per-run health transitions out.

Inputs ``agent.steps`` and ``agent.outcomes`` (and, when ``trusted_outcomes_topic`` is set, the
verifiers' own receipts topic, trusted by channel: docs/receipts.md), aligned in event time, and the ticks
topic (moves the event clock, fires due timers); outputs ``agent.health``, keyed by run
id on the input partition; state: each run's :class:`~loopwarden.rules.RunState` in the
``<app id>-runs-changelog``. The fold is :class:`~loopwarden.stages.health.task.PartitionTask`;
this module declares the stage and records its metrics from what each commit returns.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from operator import attrgetter
from typing import cast

from loopwarden.rules import TIMER_REASONS, Settings
from loopwarden.stages.health.batch import Batch, wall_clock_ms
from loopwarden.engine.config import Config
from loopwarden.engine.metrics import Metrics
from loopwarden.engine.stage import Input, StageBase
from loopwarden.stages.health.recoverypolicies import load_policies
from loopwarden.stages.health.task import PartitionTask
from loopwarden.engine.topics import ensure_topics
from loopwarden.stages.health.topology import TopologyWatch


_moves = attrgetter("from_state", "to_state")
_agents = attrgetter("agent", "to_state")


class HealthStage(StageBase[PartitionTask, Batch]):
    name = "health"
    store_name = "runs"

    def __init__(self, config: Config, metrics: Metrics, verifiers=None) -> None:
        self.config = config
        self.metrics = metrics
        # loopwarden.trust.TrustedVerifiers or None; with the trusted topic, how the task decides trust (None: all count)
        self.trust = _receipt_trust(verifiers, config.trusted_outcomes_topic)
        self.settings = Settings(retention_s=config.retention_s, seq_memory_s=config.seq_memory_s)
        verified = config.trusted_outcomes_topic
        self.inputs = (Input(config.steps_topic, "steps"), Input(config.outcomes_topic, "outcomes"),
                       *([Input(verified, "verified_outcomes")] if verified else []),
                       Input(config.ticks_topic, "ticks", tracked=False))
        self.roles = {i.topic: i.role for i in self.inputs}
        self.outputs = (config.health_topic, config.actions_topic)
        self.keyed_like_input = frozenset((config.health_topic,))  # keyed by run id, like the inputs (actions: job id)
        # docs/recovery.md: the agents' default recovery policies (Config checked the file at start)
        self.recovery_defaults = load_policies(config.recovery_policies) if config.recovery_policies else None
        self.changelog_topic = config.changelog_topic
        self.deadletter_topic = config.deadletter_topic
        self.punctuate_every_s = config.tick_interval_s

    async def prepare(self) -> None:
        if self.config.trusted_outcomes_topic:  # before anything is created: a refused start leaves nothing behind
            from loopwarden.stages.health.acl import require_authorizer

            await require_authorizer(self.config)
        await ensure_topics(self.config)

    def layout_watch(self) -> TopologyWatch:
        return TopologyWatch(self.config)

    def task(self, partition: int, store: Mapping[bytes, bytes]) -> PartitionTask:
        c = self.config
        return PartitionTask(partition, store, self.roles, settings=self.settings, clock=c.clock,
                             max_future_ms=int(c.max_future_skew_s * 1000), health_topic=c.health_topic,
                             actions_topic=c.actions_topic, recovery_defaults=self.recovery_defaults, trust=self.trust, partitions=c.partitions,
                             settle=(c.expand_settle_ms, int(c.expand_window_s * 1000), c.max_message_bytes // 2))

    def summary(self, tasks: list[PartitionTask]) -> str:
        return f" ({sum(sum(task.state_counts.values()) for task in tasks)} runs held)"

    # -- metrics, from what happened ---------------------------------------------------
    def restored(self, partition: int, task: PartitionTask) -> None:
        self._count_runs(task.state_counts)

    def dropped(self, partition: int, task: PartitionTask) -> None:
        self._count_runs(Counter({k: -v for k, v in task.state_counts.items()}))

    def committed(self, partition: int, task: PartitionTask, result: Batch, summary: object) -> None:
        self._count_runs(cast(Counter, summary))  # PartitionTask.committed's: health -> runs, the batch's delta
        if not result:
            return
        m = self.metrics
        m.count_batch(result.counts)
        if result.actions:
            m.recovery.published(result.actions)
        transitions = result.transitions
        # The two counters per distinct (from, to) and (agent, to) of the batch, not per transition: a
        # metric update costs ~0.5 µs, and this loop was ~1 µs of the worker's CPU per event (bench/README.md).
        for (from_state, to_state), n in Counter(map(_moves, transitions)).items():
            m.child(m.transitions, from_state or "none", to_state).inc(n)
        for (agent, to_state), n in Counter(map(_agents, transitions)).items():  # agents in order of first sight
            m.child(m.agent_transitions, m.agent_label(agent), to_state).inc(n)
        now_ms = wall_clock_ms()
        latency, timer_latency = m.latency, m.timer_latency
        for t in transitions:
            (timer_latency if t.reason in TIMER_REASONS else latency).observe(max(0.0, (now_ms - t.ts) / 1000))

    def aborted(self, partition: int, task: PartitionTask, result: Batch) -> None:
        m = self.metrics
        for key, n in result.counts.items():
            if key[0] == "event" and key[1] != "ticks":
                m.child(m.redelivered, key[1]).inc(n)

    def _count_runs(self, delta: Mapping) -> None:
        m = self.metrics
        for state, n in delta.items():
            if state is not None and n:
                m.child(m.runs, state).inc(n)


def _receipt_trust(verifiers, channel: str | None):
    if verifiers is None and channel is None:
        return None  # no trust setting: the task hands receipts to the core as they are
    from loopwarden.trust import ReceiptTrust

    return ReceiptTrust(verifiers, channel)
