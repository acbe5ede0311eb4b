"""Which partition each output of a stage goes to, without the producer's own partitioner."""

from __future__ import annotations

from loopwarden.engine.assignment import murmur2

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
