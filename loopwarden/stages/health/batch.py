"""What the health stage's fold returns (:class:`Batch`), and the keys of its store that are not runs."""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field

import msgspec

from loopwarden.codecs import HealthTransition
from loopwarden.codecs.events import RecoveryAction
from loopwarden.engine.stage import DeadLetter, Output

# Keys of a partition's store that are not run ids: 0xff never occurs in UTF-8, so no
# run id can name, read or overwrite them.
META_PREFIX = b"\xffloopwarden/"
CLOCK_KEY = META_PREFIX + b"clock"


def is_meta(key: bytes) -> bool:
    return key[:1] == b"\xff"


_encode_clock = msgspec.msgpack.Encoder().encode
_decode_clock = msgspec.msgpack.Decoder(int).decode


@dataclass
class Batch:
    """A partition's outputs for one batch, to be committed in one transaction, in this order."""

    transitions: list[HealthTransition] = field(default_factory=list)
    actions: list[RecoveryAction] = field(default_factory=list)  # for agent.actions (docs/recovery.md)
    outputs: list[Output] = field(default_factory=list)  # the transitions, encoded for the health topic
    deadletters: list[DeadLetter] = field(default_factory=list)
    # changelog/store: key -> the run's last state in the batch, None deletes (retention)
    changes: dict[bytes, bytes | None] = field(default_factory=dict)
    # topic -> next offset to consume, for every input topic the batch consumed from
    offsets: dict[str, int] = field(default_factory=dict)
    # bounded-label counts for metrics, aggregated per batch: (metric kind, label, ...) -> n
    counts: Counter = field(default_factory=Counter)
    consumed: int = 0  # input records (steps, outcomes, ticks)

    def __bool__(self) -> bool:
        return bool(self.transitions or self.deadletters or self.changes or self.offsets)


def wall_clock_ms() -> int:
    return int(time.time() * 1000)
