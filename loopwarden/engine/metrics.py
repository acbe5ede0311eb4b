"""Prometheus metrics of one worker. Labels come only from bounded sets; never run ids."""

from __future__ import annotations

import time
from bisect import bisect_left

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector
from prometheus_client.core import HistogramMetricFamily
from prometheus_client.utils import floatToGoString

from loopwarden.codecs import CAUSES, STATES
from loopwarden.codecs.vocabulary import DISAGREEMENTS, IGNORED, INVALID_REASONS, RECEIPT_OUTCOMES, TIMER_KINDS

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


class HotHistogram:
    """An unlabelled histogram observed once per transition: ``observe`` is a bisect and two adds.

    prometheus_client's ``Histogram.observe`` takes ~1.5 µs (a lock for each value it adds); at 0.42
    transitions per input event that was ~0.6 µs of the worker's CPU per event (bench/README.md,
    "g latency"). Exposed as prometheus_client exposes a Histogram (``_bucket`` cumulative by ``le``,
    ``_count``, ``_sum``, ``_created``); ``tests/unit/test_hot_histogram.py`` checks the two agree."""

    def __init__(self, name: str, documentation: str, buckets: tuple[float, ...], registry: CollectorRegistry) -> None:
        self.name, self.documentation = name, documentation
        self.bounds = [float(b) for b in buckets]  # sorted; +Inf after the last
        self.counts = [0] * (len(self.bounds) + 1)  # per bucket, not cumulative
        self.sum = 0.0
        self.created = time.time()
        self._le = [floatToGoString(b) for b in self.bounds] + ["+Inf"]
        registry.register(self)

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1  # the first bucket whose bound is >= value
        self.sum += value

    def describe(self) -> list[HistogramMetricFamily]:
        return [HistogramMetricFamily(self.name, self.documentation)]

    def collect(self) -> list[HistogramMetricFamily]:
        buckets, total = [], 0
        for le, n in zip(self._le, self.counts):
            total += n
            buckets.append((le, total))
        family = HistogramMetricFamily(self.name, self.documentation, buckets=buckets, sum_value=self.sum)
        family.add_sample(self.name + "_created", {}, self.created)
        return [family]


class Metrics:
    """All series are created up front so dashboards see zeros, not gaps."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        if registry is None:
            registry = CollectorRegistry()
            ProcessCollector(registry=registry)  # process_resident_memory_bytes, CPU seconds, open fds
        self.registry = registry
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
        self.transaction_seconds = Histogram(
            "loopwarden_transaction_seconds",
            "A batch transaction from begin to commit (its broker round trips): the floor under the latency.",
            buckets=(0.0025, 0.005, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1, 0.25, 0.5, 1, 2.5, 10),
            registry=r,
        )
        self.agent_transitions = Counter(
            "loopwarden_agent_transitions_total",
            f"Health transitions by the run's agent (the first {AGENT_LABELS_MAX} names seen; then 'other') "
            "and to state.", ["agent", "to_state"], registry=r)
        self._agents: set[str] = set()
        self.malloc_trim = Histogram(
            "loopwarden_malloc_trim_seconds",
            "Handing the C heap's free pages back to the OS (glibc malloc_trim, every malloc_trim_s).",
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25),
            registry=r,
        )
        self.redelivered = Counter(
            "loopwarden_redelivered_total",
            "Input messages consumed again after a transaction of theirs failed (the partition was recovered).",
            ["topic"], registry=r)
        self.produce_failures = Counter(
            "loopwarden_produce_failures_total",
            "Transactions that failed (aborted or fenced); their batch is consumed again after recovery.",
            registry=r)
        self.transactions = Counter("loopwarden_transactions_total", "Batch transactions, by result.",
                                    ["result"], registry=r)
        self.group_commits = Counter(
            "loopwarden_group_commits_total",
            "Commits of the group's offsets by the consumer, after the transactions, by result (committed/failed).",
            ["result"], registry=r)
        self.batch_records = Histogram(
            "loopwarden_batch_records", "Input records per partition per committed transaction.",
            buckets=(1, 10, 50, 100, 250, 500, 1000, 2500, 5000, 10000), registry=r)
        self.restored = Counter("loopwarden_restored_records_total",
                                "Changelog records read to recover assigned partitions.", registry=r)
        self.lag = Gauge("loopwarden_consumer_lag",
                         "High watermark minus committed offset, per input topic role and partition owned.",
                         ["topic", "partition"], registry=r)
        self.stalled = Gauge("loopwarden_stalled_partitions",
                             "Owned partitions with lag whose committed offset has not moved for the stall timeout.",
                             registry=r)
        self.stalls = Counter("loopwarden_stalls_total", "Times an owned partition was found stalled.", registry=r)
        self.topology_blocked = Gauge(
            "loopwarden_topology_blocked",
            "1 while the topic layout stops processing (a co-partitioned topic grown alone, an output deleted or "
            "re-created; /readyz says which), else 0.", registry=r)
        self.producers_stopping = Gauge(
            "loopwarden_producers_stopping",
            "Producers of dropped partitions still stopping: one whose sends wait for a partition that is gone (an "
            "output deleted) stops once that output is back, asking for the topic every few ms meanwhile.",
            registry=r)
        self.input_waiting_bytes = Gauge(
            "loopwarden_input_waiting_bytes",
            "Bytes of input record values fetched and not folded yet, or held for stream-time alignment "
            "(bounded by input_buffer_max_bytes), by stage (health; otel: the bridge).", ["stage"], registry=r)
        self.input_waiting_peak_bytes = Gauge(
            "loopwarden_input_waiting_peak_bytes",
            "The most bytes of input record values waiting at once since the worker started, as "
            "loopwarden_input_waiting_bytes counts them (what to size input_buffer_max_bytes by), by stage.",
            ["stage"], registry=r)
        self.input_buffer_full = Counter(
            "loopwarden_input_buffer_full_total",
            "Times the input records waiting reached input_buffer_max_bytes: the loop waited for its pipelines "
            "(waited), the inputs running ahead that records held for alignment came from were paused (paused), or, "
            "with nothing to pause, those records were folded as they are (unaligned).", ["stage", "then"], registry=r)
        self.inputs_paused = Gauge(
            "loopwarden_inputs_paused",
            "Input partitions not fetched now, by stage and reason: dropped (given up after a failure or a fence, "
            "until owned again), layout (the topic layout is wrong), ahead (running ahead of the other input in "
            "stream time while the task holds all it may of it: fetched again once the other input caught up).",
            ["stage", "reason"], registry=r)
        self.repartitioned = Counter(
            "loopwarden_repartitioned_events_total",
            "Input records of runs that moved with `loopwarden topics expand`: copied (its copy is on the new "
            "partition already: skipped) or forwarded (from a producer still hashing over the old count).",
            ["how"], registry=r)
        for how in ("copied", "forwarded"):
            self.repartitioned.labels(how)
        self.topology_changes = Counter("loopwarden_topology_changes_total",
                                        "Times the topic layout was found to stop processing.", registry=r)
        # The OpenTelemetry bridge (loopwarden.stages.otel): spans by what became of them, events it published,
        # traces held per owned partition of otlp_spans.
        self.otel_spans = Counter("loopwarden_otel_spans_total",
                                  "Spans the OpenTelemetry bridge read, by outcome (spans: folded; the others: counted "
                                  "and ignored, or traces dropped).", ["outcome"], registry=r)
        self.otel_events = Counter("loopwarden_otel_events_total",
                                   "Events the OpenTelemetry bridge published on agent.steps, by type.", ["type"],
                                   registry=r)
        self.otel_traces = Gauge("loopwarden_otel_traces", "Traces the OpenTelemetry bridge holds, per owned partition.",
                                 ["partition"], registry=r)
        from loopwarden.stages.health.recoverymetrics import RecoveryMetrics

        self.recovery = RecoveryMetrics(r)  # docs/recovery.md: actions published, operator actions refused
        for result in ("committed", "aborted", "fenced"):
            self.transactions.labels(result)
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

    def child(self, metric, *labels: str):
        """``metric.labels(*labels)``, cached: the lookup is the costly part on the hot path."""
        key = (metric, labels)
        found = self._children.get(key)
        if found is None:
            found = self._children[key] = metric.labels(*labels)
        return found

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
        elif kind == "operator_action":
            self.recovery.operator_action(label, n)
