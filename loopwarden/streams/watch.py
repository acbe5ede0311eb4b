"""Lag and stalls of the assigned partitions, and the C heap handed back to the OS now and then.

Lag is the high watermark minus the *committed* offset (what was consumed but not
committed is not progress). A partition with lag whose committed offsets have not
moved for ``stall_timeout_s`` is stalled (``/readyz`` says 503): one that fails and
recovers again and again makes no progress either, and shows as stalled.
"""

from __future__ import annotations

import logging
import time

from aiokafka import AIOKafkaConsumer, TopicPartition

from loopwarden.streams import memory
from loopwarden.streams.metrics import Metrics
from loopwarden.streams.partition import AssignedPartition

log = logging.getLogger("loopwarden.worker")


# How often the loop's turn measures lag and looks for stalls. Every turn (a few hundred a second at 13 kev/s,
# each a gauge child per partition and input) was 3.4 % of the worker's CPU in bench g (py-spy, session 12);
# a scrape reads the gauges every few seconds and a stall takes stall_timeout_s.
CHECK_EVERY_S = 0.25


class Watch:
    """Measures lag per tracked input partition and finds stalls (at most every ``every_s``); trims the heap every
    ``malloc_trim_s``."""

    def __init__(self, consumer: AIOKafkaConsumer, tracked: dict[str, str], metrics: Metrics,
                 stall_timeout_s: float, malloc_trim_s: float, every_s: float = CHECK_EVERY_S) -> None:
        self.consumer = consumer
        self.tracked = tracked  # topic -> role (the lag gauge's label)
        self.metrics = metrics
        self.stall_timeout_s = stall_timeout_s
        self.malloc_trim_s = malloc_trim_s
        self.trimmed_at = time.monotonic()
        self.every_s = every_s
        self.checked_at = float("-inf")

    def check(self, assigned: dict[int, AssignedPartition]) -> None:
        now = time.monotonic()
        if now - self.checked_at < self.every_s:
            return
        self.checked_at = now
        m = self.metrics
        for p in sorted(assigned):
            a = assigned[p]
            lagging = False
            for topic, role in self.tracked.items():
                hw = self.consumer.highwater(TopicPartition(topic, p))
                committed = a.committed.get(topic)
                if hw is None or committed is None:
                    continue
                lag = max(0, hw - committed)
                m.lag.labels(role, str(p)).set(lag)
                lagging |= lag > 0
            stalled = lagging and now - a.progress_at >= self.stall_timeout_s
            if stalled and not a.stalled:
                m.stalls.inc()
                log.error("partition %d stalled: lag and no progress for %.0fs", p, now - a.progress_at)
            a.stalled = stalled
        m.stalled.set(sum(a.stalled for a in assigned.values()))
        if self.malloc_trim_s and now - self.trimmed_at >= self.malloc_trim_s:
            self.trimmed_at = now
            took = memory.trim()
            if took is not None:
                m.malloc_trim.observe(took)

    def forget(self, p: int) -> None:
        """``p`` is no longer assigned: its lag series go."""
        for role in self.tracked.values():
            try:
                self.metrics.lag.remove(role, str(p))
            except KeyError:
                pass
