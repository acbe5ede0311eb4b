"""What the Faust agent does with one message, without the Faust and Kafka parts.

The agent hands every message (input event or tick) to :meth:`Processor.on_message`
and performs the returned :class:`Output`: produce transitions, dead-letter the
message. Per-run state lives in a mapping (the Faust table; a dict in tests),
stored as MessagePack of :class:`Stored` (the run state plus the partition it
belongs to, so timers can be rebuilt per partition after a rebalance).

Offsets are checkpointed in the table too: on each tick, when a partition has consumed
anything since its last checkpoint, a record of the next offset to consume on each of
its input topics (and its event-time clock) is written after the states it covers,
under a key no run id can have (a partition's first message writes its first one
with its state). After a restart or rebalance the worker resumes from
that checkpoint, not from what the consumer group committed: the checkpoint is never
ahead of the table, and it may be behind by at most one tick interval of messages,
which are applied again as no-ops (the state already holds them). In a running worker
a message below the partition's consumed offset is skipped as redelivered.

Timers cost O(due timers) per tick: one :class:`TimerQueue` per owned partition
(at most one entry per run), kept in memory and rebuilt from the table after every rebalance.
"""

from __future__ import annotations

import logging
import time
from collections.abc import MutableMapping
from dataclasses import dataclass, field

import msgspec

from loopwarden.codecs import STATES, HealthTransition, InvalidEvent, decode_outcome_event, decode_step_event
from loopwarden.rules import RunState, Settings, apply, fire_next, next_deadline
from loopwarden.rules.machine import Result
from loopwarden.rules.timers import TimerQueue
from loopwarden.streams.metrics import Metrics

log = logging.getLogger("loopwarden.processor")


class Stored(msgspec.Struct, array_like=True):
    """A table value: the run's state and the partition its events arrive on."""

    partition: int
    state: RunState


class Tick(msgspec.Struct, frozen=True):
    """A timer tick, produced to every partition of the ticks topic."""

    now_ms: int | None = None  # None: use the processor's clock


# Run states are keyed by the run id as UTF-8; a partition's checkpoint by a key that is
# not UTF-8 (0xff never occurs in it), so no run id can name, read or overwrite it.
CHECKPOINT_PREFIX = b"\xffloopwarden/offsets/"


def checkpoint_key(partition: int) -> bytes:
    return CHECKPOINT_PREFIX + str(partition).encode()


def is_checkpoint(key: bytes) -> bool:
    return key.startswith(CHECKPOINT_PREFIX)


class Checkpoint(msgspec.Struct, array_like=True):
    """A partition's progress, as durable as the states written before it."""

    offsets: dict[str, int]  # input topic -> next offset to consume
    clock: int = 0  # the partition's event-time clock (clock == "event")


_encode_checkpoint = msgspec.msgpack.Encoder().encode
_decode_checkpoint = msgspec.msgpack.Decoder(Checkpoint).decode
_encode_stored = msgspec.msgpack.Encoder().encode
_decode_stored = msgspec.msgpack.Decoder(Stored).decode
_decode_tick = msgspec.json.Decoder(Tick).decode
encode_tick = msgspec.json.Encoder().encode


@dataclass
class DeadLetter:
    reason: str
    error: str


@dataclass
class Output:
    """What the agent must do, in this order: produce ``transitions`` and the dead letter,
    wait for their acks, then write ``writes`` to the table and its changelog, in order
    (table key -> value, None deletes; the partition's checkpoint comes last). Written
    after the acks, a restart can repeat a transition (same run_id, seq) but never lose one."""

    transitions: list[HealthTransition] = field(default_factory=list)
    deadletter: DeadLetter | None = None
    writes: dict[bytes, bytes | None] = field(default_factory=dict)
    # partition -> {topic: next offset}: consumed once ``writes`` are durable
    offsets: dict[int, dict[str, int]] = field(default_factory=dict)
    # partition -> the offsets of the checkpoint in ``writes``
    checkpointed: dict[int, dict[str, int]] = field(default_factory=dict)
    redelivered: bool = False  # skipped: this worker already applied this message


def wall_clock_ms() -> int:
    return int(time.time() * 1000)


class Processor:
    """Per-worker processing state around the pure core."""

    def __init__(
        self,
        table: MutableMapping[bytes, bytes],
        *,
        steps_topic: str,
        outcomes_topic: str,
        ticks_topic: str,
        settings: Settings,
        metrics: Metrics,
        clock: str = "wall",
        wall_ms=wall_clock_ms,
        caught_up=lambda partition: True,
    ) -> None:
        self.table = table
        self.roles = {steps_topic: "steps", outcomes_topic: "outcomes", ticks_topic: "ticks"}
        self.settings = settings
        self.metrics = metrics
        self.clock_mode = clock
        self.wall_ms = wall_ms
        # Whether this worker has consumed its inputs of a partition up to their end:
        # a backlog after a restart must not make runs look idle.
        self.caught_up = caught_up
        self.timers: dict[int, TimerQueue] = {}  # per owned partition
        # States changed while handling the current message, not yet written to the table.
        self.pending: dict[bytes, bytes | None] = {}
        # Per owned partition, the next offset to consume per input topic (updated once a
        # message's writes are durable), and the offsets of its last checkpoint record.
        self.offsets: dict[int, dict[str, int]] = {}
        self.checkpointed: dict[int, dict[str, int]] = {}
        self.clocks: dict[int, int] = {}  # event-time clock per partition (clock == "event")
        self.state_counts: dict[str, int] = {}

    # -- clock ----------------------------------------------------------------------
    def _now(self, partition: int, ts: int | None) -> int:
        """Processing time, or in event-time mode the partition's clock moved to ``ts``.

        Only events on agent.steps and ticks move the event-time clock: receipts are
        consumed from another topic, possibly far ahead, and are not activity.
        """
        if self.clock_mode == "wall":
            return self.wall_ms()
        clock = max(self.clocks.get(partition, 0), ts or 0)
        self.clocks[partition] = clock
        return clock

    # -- table ----------------------------------------------------------------------
    def load(self, run_id: str) -> RunState | None:
        key = run_id.encode()
        raw = self.pending[key] if key in self.pending else self.table.get(key)
        return None if raw is None else _decode_stored(raw).state

    def _store(self, partition: int, run_id: str, res: Result, out: Output, before: str | None) -> None:
        for kind, label in res.notes:
            self.metrics.note(kind, label)
        now_wall = self.wall_ms()
        for t in res.transitions:
            self.metrics.child(self.metrics.transitions, t.from_state or "none", t.to_state).inc()
            self.metrics.latency.observe(max(0.0, (now_wall - t.ts) / 1000))
        out.transitions += res.transitions
        state = res.state
        after = state.health if state is not None else None
        if before != after:
            self._count(before, -1)
            self._count(after, +1)
        raw = None if state is None else _encode_stored(Stored(partition, state))
        key = run_id.encode()
        out.writes[key] = self.pending[key] = raw
        if state is None:
            return
        self.timers.setdefault(partition, TimerQueue()).schedule(run_id, next_deadline(state, self.settings))

    def _count(self, state: str | None, delta: int) -> None:
        if state is None:
            return
        self.state_counts[state] = self.state_counts.get(state, 0) + delta
        self.metrics.child(self.metrics.runs, state).set(self.state_counts[state])

    def apply_writes(self, out: Output) -> None:
        """Write the output's states to the table (after the transitions were acked).

        Call :meth:`end_batch` once every output of a batch is applied."""
        for key, raw in out.writes.items():
            if raw is None:
                self.table.pop(key, None)
            else:
                self.table[key] = raw
        self.offsets.update(out.offsets)
        self.checkpointed.update(out.checkpointed)

    def end_batch(self) -> None:
        """Forget the states of the message just handled (they are in the table now)."""
        self.pending.clear()

    def rebuild(self, items, partitions: set[int]) -> int:
        """Rebuild timer queues, state counts and offset checkpoints from the table (after recovery).

        Only keys of ``partitions`` (this worker's active ones) count: the memory
        store may still hold keys of partitions that moved to another worker.
        """
        self.timers.clear()
        self.offsets = {}
        self.checkpointed = {}
        self.state_counts = {}
        for state in STATES:
            self.metrics.runs.labels(state).set(0)
        n = 0
        for key, raw in items:
            if is_checkpoint(key):
                partition = int(key[len(CHECKPOINT_PREFIX):])
                if partition in partitions:
                    cp = _decode_checkpoint(raw)
                    self.offsets[partition] = self.checkpointed[partition] = cp.offsets
                    if self.clock_mode == "event":
                        self.clocks[partition] = max(self.clocks.get(partition, 0), cp.clock)
                continue
            stored = _decode_stored(raw)
            if stored.partition not in partitions:
                continue
            run_id = key.decode() if isinstance(key, bytes) else key
            n += 1
            self._count(stored.state.health, +1)
            self.timers.setdefault(stored.partition, TimerQueue()).schedule(
                run_id, next_deadline(stored.state, self.settings))
        return n

    # -- timers ---------------------------------------------------------------------
    def fire_due(self, partition: int, now_ms: int, out: Output) -> None:
        """Fire every due timer of ``partition`` in deadline order: O(due timers)."""
        queue = self.timers.get(partition)
        if queue is None:
            return
        for deadline, run_id in queue.pop_due(now_ms):
            state = self.load(run_id)
            if state is None:
                continue
            current = next_deadline(state, self.settings)
            if current != deadline:
                queue.schedule(run_id, current)  # moved since queued
                continue
            before = state.health
            self._store(partition, run_id, fire_next(state, now_ms, self.settings), out, before)

    # -- messages -------------------------------------------------------------------
    def on_message(
        self,
        topic: str,
        partition: int,
        key: bytes | None,
        value: bytes | None,
        content_type: str | None = None,
        offset: int | None = None,
    ) -> Output:
        """Handle one consumed message. Never raises on anything a producer can send.

        With ``offset`` (the worker passes it), a steps/outcomes message below its
        partition's consumed offset is skipped as redelivered, and any other one moves
        that offset past it (``out.offsets``). A tick writes the partition's checkpoint
        when that moved. Ticks themselves are not checkpointed: a repeated or missed
        tick is harmless, the next one fires what is due.
        """
        out = Output()
        role = self.roles.get(topic)
        if role is None:
            out.deadletter = DeadLetter("wrong_topic", f"topic {topic!r} is not an input of this processor")
            self.metrics.invalid.labels("steps", "wrong_topic").inc()
            return out
        if role == "ticks":
            try:
                tick = _decode_tick(value or b"{}")
            except (msgspec.ValidationError, msgspec.DecodeError) as exc:
                return self._reject(out, role, InvalidEvent("undecodable", f"bad tick: {exc}"))
            self.metrics.child(self.metrics.events, "ticks", "tick").inc()
            now = self._now(partition, tick.now_ms)
            # Timers fire only on a caught-up partition: while a backlog is consumed, a
            # run whose next events are still in it must not be declared stuck. (An
            # event-time tick's clock is kept and used by the next tick.)
            if self.caught_up(partition):
                self.fire_due(partition, now, out)
            self._checkpoint(out, partition, self.offsets.get(partition))
            return out
        if offset is not None:
            expected = self.offsets.get(partition, {}).get(topic)
            if expected is not None and offset < expected:
                self.metrics.child(self.metrics.redelivered, role).inc()
                out.redelivered = True
                return out
            if expected is not None and offset > expected:
                self.metrics.child(self.metrics.offset_gaps, role).inc()
                log.warning("%s[%d]: consumed offset %d, expected %d: %d offsets never seen",
                            topic, partition, offset, expected, offset - expected)
        self._on_input(out, role, topic, partition, key, value, content_type)
        if offset is not None:
            self.consumed(out, topic, partition, offset)
            if partition not in self.checkpointed:
                # The partition's first checkpoint comes with its first message: until a
                # checkpoint exists, only the group's commit would say where to resume.
                self._checkpoint(out, partition, out.offsets[partition])
        return out

    def consumed(self, out: Output, topic: str, partition: int, offset: int) -> None:
        """Record that the message at ``offset`` is handled once ``out`` is applied."""
        if self.roles.get(topic) in ("steps", "outcomes"):
            out.offsets[partition] = {**self.offsets.get(partition, {}), topic: offset + 1}

    def _checkpoint(self, out: Output, partition: int, offsets: dict[str, int] | None) -> None:
        """Add the partition's checkpoint at ``offsets`` to ``out.writes`` unless it is written already.

        Last in ``writes``: after the states it covers. ``offsets`` are those already
        consumed (their writes acked) or consumed by ``out`` itself."""
        if not offsets or offsets == self.checkpointed.get(partition):
            return
        out.writes[checkpoint_key(partition)] = _encode_checkpoint(Checkpoint(offsets, self.clocks.get(partition, 0)))
        out.checkpointed[partition] = offsets

    def _on_input(self, out: Output, role: str, topic: str, partition: int, key: bytes | None,
                  value: bytes | None, content_type: str | None) -> None:
        """Decode and apply one steps/outcomes message, or dead-letter it."""
        try:
            decode = decode_step_event if role == "steps" else decode_outcome_event
            event = decode(value if value is not None else b"", content_type)
        except InvalidEvent as exc:
            self._reject(out, role, exc)
            return
        if key is None or key != event.run_id.encode():
            shown = None if key is None else key[:80]
            self._reject(out, role, InvalidEvent(
                "key_mismatch",
                f"message key {shown!r} does not match run_id {event.run_id!r} (events must be keyed by run_id)",
            ))
            return
        self.metrics.child(self.metrics.events, role, event.__struct_config__.tag).inc()
        now = self._now(partition, event.ts if role == "steps" else None)
        # The core fires this run's own timers due by the event's ts first; other runs'
        # timers wait for the next tick.
        state = self.load(event.run_id)
        before = state.health if state is not None else None
        self._store(partition, event.run_id, apply(state, event, now), out, before)

    def _reject(self, out: Output, role: str, exc: InvalidEvent) -> Output:
        self.metrics.invalid.labels(role, exc.reason).inc()
        out.deadletter = DeadLetter(exc.reason, str(exc))
        return out

    def runs_in_state(self, state: str, partitions: set[int], limit: int = 1000) -> list[dict]:
        """Runs of this worker in ``state`` (a table scan; for the read API, not the hot path)."""
        found = []
        for key, raw in list(self.table.items()):
            if is_checkpoint(key):
                continue
            stored = _decode_stored(raw)
            if stored.partition in partitions and stored.state.health == state:
                found.append({"run_id": stored.state.run_id, "seq": stored.state.seq, "agent": stored.state.agent})
                if len(found) >= limit:
                    break
        return found
