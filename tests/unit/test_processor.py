"""The stream processor's per-message path without Kafka: offset checkpoints and restarts.

A dict stands in for the Faust table and a list of (topic, partition, offset, message)
for the consumed log, so a worker crash can be cut anywhere: what the table holds is
exactly what a restarted worker recovers from the changelog. Ticks (which write the
checkpoints) come after every TICK_EVERY-th message of the log, as a worker's timer would.
"""

from __future__ import annotations

import zlib
from collections import defaultdict

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loopwarden.codecs import decode_input
from loopwarden.replay import Replay
from loopwarden.rules import Settings
from loopwarden.simulate import fleet
from loopwarden.streams.metrics import Metrics
from loopwarden.streams.processor import (
    CHECKPOINT_PREFIX,
    Processor,
    Tick,
    checkpoint_key,
    encode_tick,
    is_checkpoint,
)

TOPICS = {"steps": "agent.steps", "outcomes": "agent.outcomes"}
TICKS = "loopwarden.ticks"
PARTITIONS = 3
ADVANCE_MS = 3_600_000
TICK_EVERY = 10
MESSAGES = fleet(120, seed=11, bad_every=15)
LAST_TS = max(m.ts for m in MESSAGES)


def consumed_log(messages) -> list[tuple[str, int, int, object]]:
    """The messages as a worker consumes them: (topic, partition, offset, message), offsets per partition."""
    next_offset: dict[tuple[str, int], int] = defaultdict(int)
    out = []
    for m in messages:
        topic = TOPICS[m.topic]
        partition = zlib.crc32(m.key or b"") % PARTITIONS
        out.append((topic, partition, next_offset[topic, partition], m))
        next_offset[topic, partition] += 1
    return out


LOG = consumed_log(MESSAGES)
POSITION = {(t, p, o): i for i, (t, p, o, _) in enumerate(LOG)}


def processor(table: dict) -> Processor:
    return Processor(table, steps_topic=TOPICS["steps"], outcomes_topic=TOPICS["outcomes"], ticks_topic=TICKS,
                     settings=Settings(), metrics=Metrics(), clock="event")


class Worker:
    """A processor plus what it produced, driven the way the Faust agent drives it."""

    def __init__(self, table: dict) -> None:
        self.table = table
        self.proc = processor(table)
        self.proc.rebuild(table.items(), set(range(PARTITIONS)))
        self.transitions: list = []
        self.deadletters = 0
        self.redelivered = 0

    def handle(self, topic, partition, offset, value, key=None, *, crash_before_writes: bool = False) -> None:
        out = self.proc.on_message(topic, partition, key, value, None, offset)
        self.transitions += out.transitions  # produced (and acked) first
        self.deadletters += out.deadletter is not None
        self.redelivered += out.redelivered
        if crash_before_writes:
            return
        self.proc.apply_writes(out)
        self.proc.end_batch()

    def tick(self, now_ms: int | None = None) -> None:
        for p in range(PARTITIONS):
            self.handle(TICKS, p, None, encode_tick(Tick(now_ms=now_ms)))

    def consume(self, entries) -> None:
        for topic, partition, offset, m in entries:
            self.handle(topic, partition, offset, m.value, m.key)
            if POSITION[topic, partition, offset] % TICK_EVERY == TICK_EVERY - 1:
                self.tick()

    def finish(self) -> None:
        self.tick(LAST_TS + ADVANCE_MS)


def final(transitions) -> dict[str, str]:
    best: dict[str, tuple[int, str]] = {}
    for t in transitions:
        if t.run_id not in best or t.seq > best[t.run_id][0]:
            best[t.run_id] = (t.seq, t.to_state)
    return {r: v[1] for r, v in best.items()}


def uninterrupted() -> Worker:
    w = Worker({})
    w.consume(LOG)
    w.finish()
    return w


BASELINE = uninterrupted()


def test_uninterrupted_processing_matches_replay() -> None:
    replay = Replay()
    for m in MESSAGES:
        if m.valid:
            replay.feed(decode_input(m.value))
    replay.advance_to(LAST_TS + ADVANCE_MS)
    assert final(BASELINE.transitions) == {r: t.to_state for r, t in replay.final.items()}
    assert BASELINE.deadletters == sum(not m.valid for m in MESSAGES) > 0


def test_a_tick_writes_the_checkpoint_of_what_its_partition_consumed() -> None:
    table: dict = {}
    proc = processor(table)
    topic, partition, offset, m = LOG[0]
    out = proc.on_message(topic, partition, m.key, m.value, None, offset)
    # The partition's first message brings its first checkpoint, after the state it covers.
    assert list(out.writes) == [m.key, checkpoint_key(partition)] and out.offsets == {partition: {topic: offset + 1}}
    assert proc.offsets == {}  # consumed once its writes are durable
    proc.apply_writes(out)
    proc.end_batch()
    assert proc.offsets == proc.checkpointed == {partition: {topic: offset + 1}}
    # A dead-lettered message is consumed too: it is kept in the dead-letter topic.
    out = proc.on_message(topic, partition, b"run-x", b"{not json", None, offset + 1)
    assert out.deadletter is not None and out.writes == {} and out.offsets == {partition: {topic: offset + 2}}
    proc.apply_writes(out)
    other = (partition + 1) % PARTITIONS
    assert proc.on_message(TICKS, other, None, encode_tick(Tick()), None).writes == {}  # consumed nothing
    out = proc.on_message(TICKS, partition, None, encode_tick(Tick()), None)
    assert list(out.writes)[-1] == checkpoint_key(partition) and out.checkpointed == {partition: {topic: offset + 2}}
    proc.apply_writes(out)
    proc.end_batch()
    assert proc.on_message(TICKS, partition, None, encode_tick(Tick()), None).writes == {}  # nothing new since
    restarted = processor(table)
    restarted.rebuild(table.items(), {partition})
    assert restarted.offsets == {partition: {topic: offset + 2}}


def test_a_message_below_the_checkpoint_is_skipped_as_redelivered() -> None:
    table: dict = {}
    w = Worker(table)
    w.consume(LOG[:40])
    before = dict(table)
    w.consume(LOG[:40])  # the consumer went back (a commit behind the table)
    assert w.redelivered == 40 and table == before
    assert w.proc.metrics.redelivered.labels("steps")._value.get() + \
        w.proc.metrics.redelivered.labels("outcomes")._value.get() == 40


def test_an_offset_past_the_checkpoint_is_counted_as_a_gap() -> None:
    w = Worker({})
    topic, partition, offset, m = LOG[0]
    w.handle(topic, partition, offset, m.value, m.key)
    later = next(e for e in LOG[1:] if e[:2] == (topic, partition))
    w.handle(topic, partition, later[2] + 5, later[3].value, later[3].key)
    assert w.proc.metrics.offset_gaps.labels("steps")._value.get() == 1
    assert w.proc.offsets[partition][topic] == later[2] + 6


def test_checkpoint_keys_are_never_run_keys() -> None:
    """Run ids are keyed as UTF-8; the checkpoint prefix is not UTF-8, so no run id can reach it."""
    for p in (0, 7, 4095):
        key = checkpoint_key(p)
        assert is_checkpoint(key)
        try:
            key.decode("utf-8")
        except UnicodeDecodeError:
            pass
        else:  # pragma: no cover
            raise AssertionError(f"{key!r} decodes as UTF-8")
    assert not is_checkpoint("\xffloopwarden/offsets/0".encode())  # the same text as a run id
    assert CHECKPOINT_PREFIX[0] == 0xFF


def test_rebuild_reads_checkpoints_of_owned_partitions_only() -> None:
    table: dict = {}
    w = Worker(table)
    w.consume(LOG)
    w.tick()
    proc = processor(table)
    n = proc.rebuild(table.items(), {0, 1})
    assert set(proc.offsets) == {0, 1} and proc.offsets[0] == w.proc.offsets[0]
    assert n == sum(1 for k in table if not is_checkpoint(k) and _partition_of(k) in (0, 1)) > 0
    assert proc.clocks[0] > 0  # the event-time clock comes back with the checkpoint


def _partition_of(key: bytes) -> int:
    return zlib.crc32(key) % PARTITIONS


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(crash_at=st.integers(0, len(LOG) - 1), rewind=st.lists(st.integers(0, 30), min_size=6, max_size=6),
       writes_lost=st.booleans())
def test_a_crash_anywhere_then_resume_from_the_checkpoint_loses_nothing(crash_at, rewind, writes_lost) -> None:
    """Cut the worker at any message (its writes lost or not); a new worker rebuilt from the table and
    consuming from anywhere at or before the checkpoints ends in the uninterrupted final states, and
    any transition it repeats has an already-seen (run_id, seq) with the same content."""
    table: dict = {}
    first = Worker(table)
    first.consume(LOG[:crash_at])
    topic, partition, offset, m = LOG[crash_at]
    first.handle(topic, partition, offset, m.value, m.key, crash_before_writes=writes_lost)

    second = Worker(table)  # recovered from the changelog = the table as it was
    tps = sorted({(t, p) for t, p, _, _ in LOG})
    start = {}
    for i, (t, p) in enumerate(tps):
        checkpoint = second.proc.offsets.get(p, {}).get(t, 0)
        start[t, p] = max(0, checkpoint - rewind[i % len(rewind)])  # a group commit behind the table
    # Only the checkpoint decides: what the second worker consumes is the log from there on.
    second.consume(e for e in LOG if e[2] >= start[e[0], e[1]])
    second.finish()

    both = first.transitions + second.transitions
    assert final(both) == final(BASELINE.transitions)
    seen: dict = {}
    for t in both:
        content = (t.from_state, t.to_state, t.reason, t.ts)
        assert seen.setdefault((t.run_id, t.seq), content) == content
    assert {(t.run_id, t.seq) for t in both} == {(t.run_id, t.seq) for t in BASELINE.transitions}
