"""Prometheus metrics of the health stage: events, transitions, runs by state, causes, receipts, timers.

Registered beside the engine's (:class:`~loopwarden.engine.metrics.EngineMetrics`, in its registry); labels
come only from the vocabulary's bounded sets, never run ids.
"""

from __future__ import annotations

from collections import Counter as Tally
from collections.abc import Iterable

from prometheus_client import Counter, Gauge

from loopwarden.codecs import CAUSES, STATES
from loopwarden.codecs.events import RecoveryAction
from loopwarden.codecs.vocabulary import (
    DISAGREEMENTS, IGNORED, INVALID_REASONS, OPERATOR_OUTCOMES, RECEIPT_OUTCOMES, TIMER_KINDS,
)
from loopwarden.engine.metrics import EngineMetrics, HotHistogram
from loopwarden.rules.recovery import ATTEMPTS_EXHAUSTED

# Label sets: the vocabulary's (imported above, defined once), plus the topic roles and event types.
TOPIC_ROLES = ("steps", "outcomes", "ticks")
EVENT_TYPES = (
    "run_started", "step_finished", "run_ended", "approval_routed", "approval_resolved", "outcome_receipt", "tick",
    # docs/contract.md section 11: what producers must also tell
    "segment_started", "run_active", "events_dropped",
    "outcome_expected",
    "operator_action",  # section 12: a person's action
)
# Agent names become label values as they are first seen, up to this many per worker; later
# names count as "other" (and a run without a name as "none"), so a producer cannot grow the
# series without bound.
AGENT_LABELS_MAX = 50


class HealthMetrics:
    """The health stage's series, created up front so dashboards see zeros, not gaps."""

    def __init__(self, engine: EngineMetrics) -> None:
        self.engine = engine
        self.registry = r = engine.registry
        self.child = engine.child
        self.invalid = engine.invalid  # the dead letters, by the health stage's topic roles and reasons
        self.events = Counter("loopwarden_events_total", "Input messages consumed, by topic role and event type.",
                              ["topic", "type"], registry=r)
        self.transitions = Counter("loopwarden_transitions_total", "Health transitions emitted, by from and to state.",
                                   ["from_state", "to_state"], registry=r)
        self.runs = Gauge("loopwarden_runs", "Runs held by this worker, by current state.", ["state"], registry=r)
        self.stop_causes = Counter("loopwarden_stop_causes_total",
                                   "Segment ends, by cause as reported by the boundary and as derived from the steps.",
                                   ["source", "cause"], registry=r)
        self.disagreements = Counter("loopwarden_disagreements_total", "Disagreements found at segment ends, by kind.",
                                     ["kind"], registry=r)
        self.receipts = Counter("loopwarden_receipts_total", "Outcome receipts, by how they arrived.",
                                ["outcome"], registry=r)
        self.ignored = Counter("loopwarden_ignored_events_total",
                               "Valid events that changed no state (duplicates, late steps, unmatched approvals).",
                               ["why"], registry=r)
        self.timers = Counter("loopwarden_timers_fired_total", "Timers fired, by kind.", ["kind"], registry=r)
        self.evicted = Counter("loopwarden_evicted_runs_total", "Runs dropped after retention, by their last state.",
                               ["state"], registry=r)
        self.latency = HotHistogram(
            "loopwarden_event_to_transition_seconds",
            "From an event's ts to the commit of the transition it caused (timer transitions excluded).",
            buckets=(0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1, 2.5, 5,
                     10, 30, 60),
            registry=r,
        )
        self.timer_latency = HotHistogram(
            "loopwarden_timer_to_transition_seconds",
            "From a timer's deadline to the commit of the transition it fired (bounded by the tick interval).",
            buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300),
            registry=r,
        )
        self.agent_transitions = Counter(
            "loopwarden_agent_transitions_total",
            f"Health transitions by the run's agent (the first {AGENT_LABELS_MAX} names seen; then 'other') "
            "and to state.", ["agent", "to_state"], registry=r)
        self._agents: set[str] = set()
        self.redelivered = Counter(
            "loopwarden_redelivered_total",
            "Input messages consumed again after a transaction of theirs failed (the partition was recovered).",
            ["topic"], registry=r)
        self.repartitioned = Counter(
            "loopwarden_repartitioned_events_total",
            "Input records of runs that moved with `loopwarden topics expand`: copied (its copy is on the new "
            "partition already: skipped) or forwarded (from a producer still hashing over the old count).",
            ["how"], registry=r)
        for how in ("copied", "forwarded"):
            self.repartitioned.labels(how)
        # Bounded recovery (docs/recovery.md): labels from bounded sets only, the action and `policy` or
        # `person` for who decided (never the policy version nor the key id).
        self.recovery_actions = Counter(
            "loopwarden_recovery_actions_total", "Recovery actions committed on agent.actions, by action and who "
            "decided (policy or person).", ["action", "decided_by"], registry=r)
        self.attempts_exhausted = Counter("loopwarden_recovery_attempts_exhausted_total",
                                          "Jobs that reached their policy's max_attempts and escalated.", registry=r)
        self.operator_refused = Counter("loopwarden_operator_actions_refused_total",
                                        "Operator actions that changed nothing, by reason.", ["reason"], registry=r)
        for reason in OPERATOR_OUTCOMES[1:]:  # all but "applied"
            self.operator_refused.labels(reason)
        for t in TOPIC_ROLES:
            if t != "ticks":
                self.redelivered.labels(t)
            for e in EVENT_TYPES:
                self.events.labels(t, e)
            for reason in INVALID_REASONS:
                self.invalid.labels(t, reason)
        for s in STATES:
            self.runs.labels(s)
            self.transitions.labels("none", s)
            for s2 in STATES:
                if s != s2:
                    self.transitions.labels(s, s2)
        for c in CAUSES:
            self.stop_causes.labels("reported", c)
            self.stop_causes.labels("derived", c)
        for d in DISAGREEMENTS:
            self.disagreements.labels(d)
        for o in RECEIPT_OUTCOMES:
            self.receipts.labels(o)
        for i in IGNORED:
            self.ignored.labels(i)
        for k in TIMER_KINDS:
            self.timers.labels(k)
        for s in STATES + ("NEVER_STARTED",):
            self.evicted.labels(s)

    def agent_label(self, agent: str | None) -> str:
        """The label value for a run's agent: its name while fewer than AGENT_LABELS_MAX are known."""
        if agent is None:
            return "none"
        if agent in self._agents:
            return agent
        if len(self._agents) < AGENT_LABELS_MAX and agent not in ("none", "other"):
            self._agents.add(agent)
            return agent
        return "other"

    def count_batch(self, counts) -> None:
        """Add a batch's aggregated counts ((kind, *labels) -> n, see loopwarden.stages.health.task)."""
        c = self.child
        for key, n in counts.items():
            kind = key[0]
            if kind == "event":
                c(self.events, key[1], key[2]).inc(n)
            elif kind == "invalid":
                c(self.invalid, key[1], key[2]).inc(n)
            else:
                self.note(kind, key[1], n)

    def note(self, kind: str, label: str, n: int = 1) -> None:
        """Count one core note (see loopwarden.rules.machine)."""
        c = self.child
        if kind == "ignored":
            c(self.ignored, label).inc(n)
        elif kind == "disagreement":
            c(self.disagreements, label).inc(n)
        elif kind == "cause":
            c(self.stop_causes, "derived", label).inc(n)
        elif kind == "reported_cause":
            c(self.stop_causes, "reported", label).inc(n)
        elif kind == "receipt":
            c(self.receipts, label).inc(n)
        elif kind == "evicted":
            c(self.evicted, label).inc(n)
            c(self.timers, "retention").inc(n)
        elif kind == "repartitioned":
            c(self.repartitioned, label).inc(n)
        elif kind == "timer":
            c(self.timers, label).inc(n)
        elif kind == "operator_action" and label != "applied":  # an applied one is counted as an action
            c(self.operator_refused, label).inc(n)

    def count_actions(self, actions: Iterable[RecoveryAction]) -> None:
        """Count a committed batch's actions: per (action, policy|person), and the jobs at their bound."""
        by: Tally = Tally()
        for a in actions:
            person = a.decided_by.startswith("person:")
            by[a.action, "person" if person else "policy"] += 1
            if a.reason == ATTEMPTS_EXHAUSTED and not person:
                self.attempts_exhausted.inc()
        for (action, who), n in by.items():
            self.child(self.recovery_actions, action, who).inc(n)
