"""The health stage's input records: decoded, or the dead letter each one is (and why)."""

from __future__ import annotations

import msgspec

from loopwarden.codecs import InvalidEvent, decode_outcome_event, decode_step_event
from loopwarden.streams.stage import DeadLetter, Record, header  # noqa: F401 (header: used by importers)


class Tick(msgspec.Struct, frozen=True):
    """A tick on the ticks topic: moves a partition's event-time clock (``now_ms``) and fires due timers."""

    now_ms: int | None = None  # None: processing time


_decode_tick = msgspec.json.Decoder(Tick).decode
encode_tick = msgspec.json.Encoder().encode
def decode_input(rec: Record, role: str, ts_limit: int, max_future_ms: int):
    """``(role, event, rec)``, or the DeadLetter the record is (``ts_limit``: the latest ts accepted)."""
    try:
        decode = decode_step_event if role == "steps" else decode_outcome_event
        event = decode(rec.value if rec.value is not None else b"", header(rec.headers, "content-type"))
    except InvalidEvent as exc:
        return DeadLetter(rec, exc.reason, str(exc))
    if rec.key is None or rec.key != event.run_id.encode():
        shown = None if rec.key is None else rec.key[:80]
        return DeadLetter(
            rec, "key_mismatch",
            f"message key {shown!r} does not match run_id {event.run_id!r} (events must be keyed by run_id)")
    if event.ts > ts_limit:
        ahead_s = (event.ts - (ts_limit - max_future_ms)) / 1000
        return DeadLetter(rec, "ts_in_future", f"ts {event.ts} is {ahead_s:.0f} s ahead of this worker's wall clock "
                                               f"(at most max_future_skew_s={max_future_ms / 1000:g} s is accepted)")
    return role, event, rec


def decode_tick(rec: Record) -> Tick | DeadLetter:
    try:
        return _decode_tick(rec.value or b"{}")
    except (msgspec.ValidationError, msgspec.DecodeError, RecursionError) as exc:
        return DeadLetter(rec, "undecodable", f"bad tick: {exc}")
