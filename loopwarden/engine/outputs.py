"""Where a batch's records go besides the changelog: outputs routed to their partitions without the
producer's own partitioner, and dead letters, an input record a fold could not use forwarded unchanged
with headers naming why."""

from __future__ import annotations

from loopwarden.engine.assignment import murmur2, partition_of
from loopwarden.engine.stage import DeadLetter, Output

HASHES_HELD = 16_384  # Router: keys whose hash is kept


class Router:
    """Which partition an output goes to when its stage leaves it to the default partitioner.

    The partition counts of the output topics are learned once a producer is up
    (:meth:`learn`); a topic keyed like the inputs with their partition count maps
    partition *i*'s outputs to *i* without hashing each key again (the default
    partitioner would pick the same)."""

    def __init__(self, input_partitions: int, keyed_like_input: frozenset[str] = frozenset()) -> None:
        self.input_partitions = input_partitions
        self.keyed_like_input = keyed_like_input
        self.counts: dict[str, int] = {}
        # key -> its hash, for the keys met again soon (the bridge's run ids: a run's events come in a few
        # batches); bounded, emptied when full. Outputs keyed like the inputs never get here.
        self._hashes: dict[bytes, int] = {}

    async def learn(self, producer, topics) -> None:
        for topic in topics:
            self.counts[topic] = len(await producer.partitions_for(topic))

    def partition(self, topic: str, key: bytes | None, p: int) -> int:
        n = self.counts[topic]
        if n == self.input_partitions and topic in self.keyed_like_input:
            return p
        if key is None:
            return p % n
        h = self._hashes.get(key)
        if h is None:
            if len(self._hashes) >= HASHES_HELD:
                self._hashes.clear()
            h = self._hashes[key] = murmur2(key) & 0x7FFFFFFF
        return h % n  # partition_of(key, n)


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
