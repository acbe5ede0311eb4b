"""What the health stage's fold returns (:class:`HealthFolded`), and the keys of its store that are not runs."""

from __future__ import annotations

from dataclasses import dataclass, field

import msgspec

from loopwarden.codecs import HealthTransition
from loopwarden.codecs.events import RecoveryAction
from loopwarden.engine.stage import Folded, wall_clock_ms  # noqa: F401 - the health stage's modules take it here

# Keys of a partition's store that are not run ids: 0xff never occurs in UTF-8, so no
# run id can name, read or overwrite them.
META_PREFIX = b"\xffloopwarden/"
CLOCK_KEY = META_PREFIX + b"clock"


def is_meta(key: bytes) -> bool:
    return key[:1] == b"\xff"


_encode_clock = msgspec.msgpack.Encoder().encode
_decode_clock = msgspec.msgpack.Decoder(int).decode


@dataclass
class HealthFolded(Folded):
    """The health stage's fold result: a :class:`~loopwarden.engine.stage.Folded` whose outputs are the batch's
    transitions encoded for the health topic and its recovery actions for the actions topic, and both decoded
    (for the stage's metrics and the task's ``/runs`` index). ``changes``: run id -> the run's last state in the batch, None deletes (retention);
    ``consumed`` counts steps, outcomes and ticks."""

    transitions: list[HealthTransition] = field(default_factory=list)
    actions: list[RecoveryAction] = field(default_factory=list)  # for agent.actions (docs/recovery.md)

    def __bool__(self) -> bool:
        return bool(self.transitions or self.deadletters or self.changes or self.offsets)
