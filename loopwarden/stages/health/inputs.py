"""The health stage's input records: decoded, or the dead letter each one is (and why)."""

from __future__ import annotations

import msgspec

from loopwarden.codecs import JSON, MSGPACK, InvalidEvent, decode_outcome_event, decode_step_event
from loopwarden.codecs.wire import MAX_EVENT_BYTES, unchecked_decoder
from loopwarden.engine.alignment import ALIGNED
from loopwarden.engine.stage import DeadLetter, Record, header  # noqa: F401 (header: used by importers)


class Tick(msgspec.Struct, frozen=True):
    """A tick on the ticks topic: moves a partition's event-time clock (``now_ms``) and fires due timers."""

    now_ms: int | None = None  # None: processing time


_decode_tick = msgspec.json.Decoder(Tick).decode
encode_tick = msgspec.json.Encoder().encode
# (role, content-type header) -> the decoder decode_step_event / decode_outcome_event would use
_UNCHECKED = {
    (role, ctype): unchecked_decoder("steps" if role == "steps" else "outcomes", ctype or JSON)
    for role in ALIGNED for ctype in (None, JSON, MSGPACK)
}


def decode_input(rec: Record, role: str, ts_limit: int, max_future_ms: int):
    """``(role, event, rec)``, or the DeadLetter the record is (``ts_limit``: the latest ts accepted)."""
    value = rec.value
    ctype = header(rec.headers, "content-type") if rec.headers else None
    event = None
    # decode_step_event / decode_outcome_event with their checks inline for the records they accept (two calls
    # and a look-up saved: 0.09-0.11 µs a record, ~1.5 % of the fold, bench/HISTORY.md "a core"); any error
    # decodes again the checked way, which names it (tests/unit/test_task_fast_paths.py: both agree).
    decode = _UNCHECKED.get((role, ctype))
    if decode is not None and value.__class__ is bytes and len(value) <= MAX_EVENT_BYTES:
        try:
            event = decode(value)
        except (msgspec.DecodeError, RecursionError):  # ValidationError is a DecodeError
            pass
    if event is None:
        try:
            checked = decode_step_event if role == "steps" else decode_outcome_event
            event = checked(value if value is not None else b"", ctype)
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


def decode_records(records, roles, ts_limit: int, max_future_ms: int, per_topic: dict[str, list], out) -> list:
    """A batch's input records decoded into ``per_topic`` (topic -> [(record, decode_input's answer)]); the
    ticks records returned as they are; a record of any other topic dead-lettered (in ``out``, a HealthFolded)."""
    ticks = []
    topic = None
    aligned = False
    for rec in records:
        if rec.topic != topic:  # a batch comes in runs of one topic's records (a fetch's, partition by partition)
            topic = rec.topic
            role = roles.get(topic)
            aligned = role in ALIGNED
            if aligned:
                items = per_topic.get(topic)
                if items is None:
                    items = per_topic[topic] = []
                add = items.append
                plain = _UNCHECKED[role, None]
        if aligned:
            # decode_input's accepting path for a record without headers, inline: 0.15 µs a record, the fold 0.97x
            # (bench/README.md "a core"); anything else, and any doubt, goes through decode_input
            # (tests/unit/test_task_fast_paths.py: both agree).
            value = rec.value
            if not rec.headers and value.__class__ is bytes and len(value) <= MAX_EVENT_BYTES:
                try:
                    event = plain(value)
                except (msgspec.DecodeError, RecursionError):  # ValidationError is a DecodeError
                    event = None
                if event is not None and rec.key == event.run_id.encode() and event.ts <= ts_limit:
                    add((rec, (role, event, rec)))
                    continue
            add((rec, decode_input(rec, role, ts_limit, max_future_ms)))
            continue
        out.consumed += 1
        out.offsets[topic] = rec.offset + 1
        if role == "ticks":
            ticks.append(rec)
        else:
            out.deadletters.append(DeadLetter(rec, "wrong_topic", f"topic {topic!r} is not an input"))
            out.counts["invalid", "steps", "wrong_topic"] += 1
    return ticks


def decode_tick(rec: Record) -> Tick | DeadLetter:
    try:
        return _decode_tick(rec.value or b"{}")
    except (msgspec.ValidationError, msgspec.DecodeError, RecursionError) as exc:
        return DeadLetter(rec, "undecodable", f"bad tick: {exc}")


def merge_by_ts(first: list, second: list) -> list:
    """``list(heapq.merge(first, second, key=lambda item: item[1].ts))``: two inputs' decoded items in event-time
    order, ties to ``first``. A copy of heapq.merge for two lists: 0.05 µs an item instead of 0.11
    (tests/unit/test_task_fast_paths.py checks it against heapq.merge)."""
    if not second:
        return first
    if not first:
        return second
    out: list = []
    take = out.append
    i = j = 0
    ends = len(first), len(second)
    head = second[0]
    head_ts = head[1].ts
    for item in first:
        while head_ts < item[1].ts:
            take(head)
            j += 1
            if j == ends[1]:
                out += first[i:]
                return out
            head = second[j]
            head_ts = head[1].ts
        take(item)
        i += 1
    out += second[j:]
    return out
