"""A paced load generator that costs little: librdkafka's producer, each message stamped with its due time.

The latency benches feed an app a stream at a fixed rate on a machine of two cores that the app, the
broker and the bench share. Sending each message from asyncio with aiokafka (a ``send`` and a timed
sleep per message) cost the bench 55 % of a core and still fell behind: at 33.5 kev/s asked it sent
20.7 kev/s (bench/README.md "g latency"), and what it took from the cores the app and the
broker waited for. Here ``produce`` is one C call that queues the message; librdkafka's own threads
batch and send (``linger.ms`` 5, as the aiokafka sender had: the same for every app). The pace is
kept in turns: each turn sends every message due by now. Each message is stamped with the wall-clock
time it was due, not the time of its turn: the stamps spread evenly as the pace asks (one stamp per
turn tied a run's ``run_ended`` and its receipt in one millisecond, which the worker orders by topic and
replay by arrival: bench c's paths then differed from replay's for 103-424 runs instead of a handful),
and a sender that falls behind counts its lag in the app's latency instead of hiding it (an open loop).

confluent-kafka comes with Quix Streams (the bench's peer); pyproject.toml's ``bench`` extra names it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence


class Sender:
    """librdkafka's idempotent producer (acks=all), for the bench's paced streams."""

    def __init__(self, bootstrap: str, linger_ms: int = 5) -> None:
        from confluent_kafka import Producer

        self.failed: list[str] = []
        # murmur2_random: the Java client's partitioner (and aiokafka's), which the worker's runs are placed by;
        # librdkafka's own default (CRC32) would put a run's events where the worker does not look for them.
        self._producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True,
                                   "linger.ms": linger_ms, "partitioner": "murmur2_random"})

    def _delivered(self, err, _msg) -> None:
        if err is not None:
            self.failed.append(str(err))

    def send(self, topic: str, key: bytes | None, value: bytes, ts_ms: int = 0) -> None:
        """Queue one message, its Kafka timestamp ``ts_ms`` (0: now); waits only while librdkafka's queue is full."""
        while True:
            try:
                self._producer.produce(topic, value, key, on_delivery=self._delivered, timestamp=ts_ms)
                return
            except BufferError:
                self._producer.poll(0.005)

    def flush(self, timeout_s: float = 60.0) -> None:
        """Every queued message acknowledged, or an error naming what was not."""
        left = self._producer.flush(timeout_s)
        if left:
            raise RuntimeError(f"sender: {left} messages not acknowledged after {timeout_s:g} s")
        if self.failed:
            raise RuntimeError(f"sender: {len(self.failed)} messages failed, first: {self.failed[0]}")

    def close(self) -> None:
        """Drop what is still queued and let librdkafka's threads go (a producer left alive keeps reconnecting to
        an unreachable broker, and logging it, for as long as the process lives)."""
        if self._producer is not None:
            self._producer.purge()
            self._producer.flush(0)
            self._producer = None

    def __enter__(self) -> Sender:
        return self

    def __exit__(self, *_exc) -> None:
        self.close()

    async def paced(self, items: Sequence, rate: float, send_one: Callable[[object, int], None],
                    on_turn: Callable[[float], None] | None = None) -> float:
        """Send ``items`` at ``rate`` per second from now: ``send_one(item, ts_ms)`` for each, ``ts_ms`` the wall
        clock of the item's place in the pace (its send is due then, and made then or within a turn after);
        ``on_turn(monotonic now)`` before each turn. Returns the seconds taken until the last one was queued."""
        t0, wall0 = time.monotonic(), time.time()
        n, i = len(items), 0
        poll = self._producer.poll
        while i < n:
            now = time.monotonic()
            if on_turn is not None:
                on_turn(now)
            due = min(n, int((now - t0) * rate) + 1)
            if due > i:
                for k in range(i, due):
                    send_one(items[k], int((wall0 + k / rate) * 1000))
                i = due
                poll(0)  # delivery reports
            wait = t0 + i / rate - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
        return time.monotonic() - t0
