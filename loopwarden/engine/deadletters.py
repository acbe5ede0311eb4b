"""Dead letters: an input record a fold could not use, forwarded unchanged with headers naming why."""

from __future__ import annotations

from loopwarden.engine.assignment import partition_of
from loopwarden.engine.stage import DeadLetter, Output

# Headers a dead letter adds; the original value is cut so the whole message fits.
OVERHEAD = 4096


def deadletter_output(d: DeadLetter, topic: str, partitions: int, max_message_bytes: int) -> Output:
    """The original message unchanged, with headers naming the error; cut to fit ``max_message_bytes``.

    Keyed as the original (the default partitioner over ``partitions``); a record without
    a key goes to its own partition number (modulo)."""
    r = d.record
    value = r.value if r.value is not None else b""
    key = r.key
    headers = [(k, v if isinstance(v, (bytes, bytearray)) else str(v).encode()) for k, v in (r.headers or ())]
    extra = [
        ("error", d.error[:2000].encode()),
        ("error_reason", d.reason.encode()),
        ("source_topic", r.topic.encode()),
        ("source_partition", str(r.partition).encode()),
        ("source_offset", str(r.offset).encode()),
    ]
    room = max_message_bytes - OVERHEAD
    size = len(value) + len(key or b"") + sum(len(k) + len(v) for k, v in headers)
    if size > room:
        # Too large to forward unchanged: keep what fits, say so (the source offset finds the original).
        headers = [(k, v) for k, v in headers if len(k) + len(v) <= 1024][:32]
        key = key[:1024] if key is not None else None
        keep = max(0, room - len(key or b"") - sum(len(k) + len(v) for k, v in headers))
        extra.append(("truncated", f"{len(value)}".encode()))
        value = value[:keep]
    partition = partition_of(key, partitions) if key else r.partition % partitions
    return Output(topic, key, value, tuple(headers + extra), partition)
