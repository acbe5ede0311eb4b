"""The bound on input records waiting in a worker's memory (``input_buffer_max_bytes``).

Two kinds wait: records the consumer handed over that no fold has taken yet
(``OwnedPartition.buffered``), and records a task holds for stream-time alignment
(``Task.holding``). Both are counted by their values' bytes (``stage.value_bytes``), over all
of an engine's partitions. ``batch_max_records`` bounds their number; this bounds their size,
which a count alone does not (an event may be 256 KiB: 20,000 of them are 5 GiB). Kafka
Streams bounds the same with ``input.buffer.max.bytes`` (KIP-770).

While the bound is reached the engine's loop waits for its pipelines instead of taking more
from the consumer. Held records cannot wait that out: the input they wait for is not
consumed meanwhile. When they fill the bound alone, :meth:`InputBound.unhold` pauses the inputs
they came from (``Alignment.pause_ahead``) and the loop goes on fetching the others, so the
input waited for catches up and the held records fold in order; a task with nothing to pause
folds them as they are, as after ``align_max_ms``. aiokafka's own fetch buffer is outside the
bound (``max_partition_fetch_bytes`` a partition, the engine's ``fetch_max_bytes`` a fetch).
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from typing import TYPE_CHECKING

from loopwarden.engine.metrics import EngineMetrics

if TYPE_CHECKING:
    from loopwarden.engine.partition import OwnedPartition

log = logging.getLogger("loopwarden.worker")


class InputBound:
    """``input_buffer_max_bytes`` over an engine's owned partitions (``loopwarden_input_waiting_bytes``, its peak
    ``loopwarden_input_waiting_peak_bytes``). Each engine has its own: ``worker --otel`` runs two (the health stage's
    and the bridge's), each bounded alone."""

    def __init__(self, max_bytes: int, metrics: EngineMetrics, stage: str) -> None:
        self.max_bytes = max_bytes
        self.gauge = metrics.input_waiting_bytes.labels(stage)
        self.peak, self.peak_gauge = 0, metrics.input_waiting_peak_bytes.labels(stage)
        self.counts = {then: metrics.input_buffer_full.labels(stage, then) for then in ("waited", "paused", "unaligned")}

    def waiting(self, parts: Collection[OwnedPartition]) -> int:
        """Bytes of the input records buffered and held now (the gauge set to them, the peak raised to them)."""
        waiting = sum(part.buffered_bytes + part.task.held_bytes for part in parts)
        self.gauge.set(waiting)
        if waiting > self.peak:  # read at every loop turn, where it is largest: a scrape sees only the moment
            self.peak = waiting
            self.peak_gauge.set(waiting)
        return waiting

    def full(self, parts: Collection[OwnedPartition]) -> bool:
        return self.waiting(parts) >= self.max_bytes

    def waited(self) -> None:
        """The loop waits for a pipeline because the bound is reached."""
        self.counts["waited"].inc()

    def unhold(self, parts: Collection[OwnedPartition]) -> bool:
        """Nothing runs and the bound is reached: each task holding records has the inputs it holds them of
        paused, or, with none to pause, folds them as they are. Whether any is to fold them now (False: the loop
        fetches the inputs not paused; nothing waits but records it hands out next)."""
        paused, unaligned = [], []
        for part in parts:
            if part.task.holding:
                newly = part.alignment.pause_ahead(part.task.held_topics)
                if newly is None:
                    part.alignment.give_up()
                    unaligned.append(part.number)
                elif newly:
                    paused.append(part.number)
        if paused:
            log.warning("records held for stream-time alignment fill input_buffer_max_bytes (%d B): partitions %s "
                        "fetch only the input they wait for until it caught up", self.max_bytes, paused)
            self.counts["paused"].inc()
        if unaligned:
            log.warning("records held for stream-time alignment fill input_buffer_max_bytes (%d B): partitions %s fold "
                        "them as they are", self.max_bytes, unaligned)
            self.counts["unaligned"].inc()
        return bool(unaligned)
