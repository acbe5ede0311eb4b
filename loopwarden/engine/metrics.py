"""Prometheus metrics of the engine: its transactions, lag, stalls, what waits in memory, the layout guard.

Labels come only from bounded sets; never run ids. A stage's own series are its ``metrics.py`` (the health
stage's, the bridge's), registered in the same registry as the engine's: :class:`EngineMetrics` is made first
and handed to them, so one ``/metrics`` serves every engine and stage of a process.
"""

from __future__ import annotations

import time
from bisect import bisect_left

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector
from prometheus_client.core import HistogramMetricFamily
from prometheus_client.utils import floatToGoString


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


class EngineMetrics:
    """The engine's series, created up front so dashboards see zeros, not gaps; the registry every stage's
    series join; and ``invalid``, the dead letters every stage counts by its own topic roles and reasons."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        if registry is None:
            registry = CollectorRegistry()
            ProcessCollector(registry=registry)  # process_resident_memory_bytes, CPU seconds, open fds
        self.registry = registry
        self._children: dict = {}
        r = self.registry
        self.invalid = Counter("loopwarden_invalid_events_total",
                               "Messages sent to the dead-letter topic, by topic role and reason.",
                               ["topic", "reason"], registry=r)
        self.transaction_seconds = Histogram(
            "loopwarden_transaction_seconds",
            "A batch transaction from begin to commit (its broker round trips): the floor under the latency.",
            buckets=(0.0025, 0.005, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1, 0.25, 0.5, 1, 2.5, 10),
            registry=r,
        )
        self.malloc_trim = Histogram(
            "loopwarden_malloc_trim_seconds",
            "Handing the C heap's free pages back to the OS (glibc malloc_trim, every malloc_trim_s).",
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25),
            registry=r,
        )
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
        self.topology_changes = Counter("loopwarden_topology_changes_total",
                                        "Times the topic layout was found to stop processing.", registry=r)
        for result in ("committed", "aborted", "fenced"):
            self.transactions.labels(result)

    def child(self, metric, *labels: str):
        """``metric.labels(*labels)``, cached: the lookup is the costly part on the hot path."""
        key = (metric, labels)
        found = self._children.get(key)
        if found is None:
            found = self._children[key] = metric.labels(*labels)
        return found
