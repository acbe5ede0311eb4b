"""Prometheus metrics of one worker. Labels come only from bounded sets; never run ids."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from loopwarden.codecs import CAUSES, STATES, InvalidEvent

TOPIC_ROLES = ("steps", "outcomes", "ticks")
EVENT_TYPES = (
    "run_started", "step_finished", "run_ended", "approval_routed", "approval_resolved", "outcome_receipt", "tick",
)
INVALID_REASONS = InvalidEvent.REASONS + ("key_mismatch", "wrong_topic")
DISAGREEMENTS = (
    "cause_mismatch", "fired_mismatch", "step_count_mismatch", "policy_overrun", "policy_unknown",
    "step_gap", "cause_not_recorded", "tool_error_unseen",
)
RECEIPT_OUTCOMES = ("on_time", "late", "negative", "held", "duplicate", "orphan")
IGNORED = (
    "duplicate_step", "step_after_end", "duplicate_run_ended", "duplicate_run_started",
    "unmatched_approval", "duplicate_receipt",
)
TIMER_KINDS = ("no_progress", "approval_expired", "receipt_window_expired", "retention")


class Metrics:
    """All series are created up front so dashboards see zeros, not gaps."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self._children: dict = {}
        r = self.registry
        self.events = Counter("loopwarden_events_total", "Input messages consumed, by topic role and event type.",
                              ["topic", "type"], registry=r)
        self.invalid = Counter("loopwarden_invalid_events_total",
                               "Messages sent to the dead-letter topic, by topic role and reason.",
                               ["topic", "reason"], registry=r)
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
        self.latency = Histogram(
            "loopwarden_event_to_transition_seconds",
            "From an event's ts to the emission of the transition it caused.",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
            registry=r,
        )
        self.redelivered = Counter(
            "loopwarden_redelivered_total",
            "Input messages skipped because this worker already applied them (offset below the consumed offset).",
            ["topic"], registry=r)
        self.offset_gaps = Counter(
            "loopwarden_offset_gaps_total",
            "Times a consumed offset skipped past the expected next one (transaction markers, or messages a consumer lost).",
            ["topic"], registry=r)
        self.produce_failures = Counter(
            "loopwarden_produce_failures_total",
            "Failed attempts to produce a message's transitions, dead letter or state changes (each is retried).",
            registry=r)
        self.lag = Gauge("loopwarden_consumer_lag", "Messages not yet consumed on this worker's partitions, by topic role.",
                         ["topic"], registry=r)
        for t in TOPIC_ROLES:
            self.lag.labels(t)
            if t != "ticks":
                self.redelivered.labels(t)
                self.offset_gaps.labels(t)
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

    def child(self, metric, *labels: str):
        """``metric.labels(*labels)``, cached: the lookup is the costly part on the hot path."""
        key = (metric, labels)
        found = self._children.get(key)
        if found is None:
            found = self._children[key] = metric.labels(*labels)
        return found

    def note(self, kind: str, label: str) -> None:
        """Count one core note (see loopwarden.rules.machine)."""
        c = self.child
        if kind == "ignored":
            c(self.ignored, label).inc()
        elif kind == "disagreement":
            c(self.disagreements, label).inc()
        elif kind == "cause":
            c(self.stop_causes, "derived", label).inc()
        elif kind == "reported_cause":
            c(self.stop_causes, "reported", label).inc()
        elif kind == "receipt":
            c(self.receipts, label).inc()
        elif kind == "evicted":
            c(self.evicted, label).inc()
            c(self.timers, "retention").inc()
        elif kind == "timer":
            c(self.timers, label).inc()
