"""The latency benches' load generator (bench/sender.py) on a real broker: every message lands where the worker
looks for its run, stamped with the time it was due, at the pace asked."""

from __future__ import annotations

import asyncio
import os
import re
import time
from collections import Counter

from bench.common import cpu_s, jit_cpu_s
from bench.ingest import create_topics
from bench.sender import Sender
from loopwarden.engine.assignment import partition_of
from tests.integration.harness import read_topic, run, unique_config


def test_the_paced_sender_places_stamps_and_paces_every_message(kafka) -> None:
    """300 keyed messages at 1,500/s: each on the partition the Java-compatible partitioner picks (the worker's
    placement; librdkafka's own default would scatter runs), each stamped (value and Kafka timestamp) with a wall
    time between the first send and the end, the stamps rising in send order and spread as the pace asks (no more
    than 2 messages in any one millisecond at 1,500/s), and the whole taking at least 299 / 1,500 s."""
    config = unique_config(kafka.bootstrap, partitions=8)
    topic = config.steps_topic
    run(create_topics(kafka.bootstrap, [topic], partitions=8))
    items = [(f"run-{i % 37}".encode(), i) for i in range(300)]
    sender = Sender(kafka.bootstrap)

    def send_one(item, ts_ms: int) -> None:
        key, i = item
        sender.send(topic, key, f"{i} {ts_ms}".encode(), ts_ms)

    t0 = int(time.time() * 1000)
    with sender:
        took = asyncio.run(sender.paced(items, 1500.0, send_one))
        sender.flush()
    t1 = int(time.time() * 1000)
    assert took >= 299 / 1500

    records = run(read_topic(config, topic, lambda r: len(r) >= 300, timeout_s=30))
    assert len(records) == 300
    stamps = {}
    for r in records:
        assert r.partition == partition_of(r.key, 8), (r.key, r.partition)
        i, ts = map(int, r.value.split())
        assert t0 <= ts <= t1
        assert r.timestamp == ts  # the Kafka timestamp is the stamp (Quix's latency is read from it)
        stamps[i] = ts
    assert sorted(stamps) == list(range(300))
    assert all(stamps[i] <= stamps[i + 1] for i in range(299))
    assert max(Counter(stamps.values()).values()) <= 2


def test_a_sender_that_cannot_deliver_says_so(tmp_path) -> None:
    """No broker at the address: flush raises, naming how much is not acknowledged, instead of returning.
    librdkafka's count is its queue: the message, and at times a request of its own beside it (the idempotent
    producer's InitProducerId): 1 or 2."""
    with Sender("127.0.0.1:1") as sender:  # closed after: else librdkafka goes on reconnecting, and logging it
        sender.send("nowhere", b"k", b"v")
        try:
            sender.flush(timeout_s=1.0)
        except RuntimeError as exc:
            assert re.fullmatch(r"sender: [12] messages not acknowledged after 1 s", str(exc)), str(exc)
        else:
            raise AssertionError("flush returned with a message undelivered")


def test_the_broker_jit_reading_counts_the_compiler_threads_only(kafka) -> None:
    """The latency bench warms its broker until HotSpot's compiler threads go quiet (bench/latency.py warm_up):
    read from /proc, their CPU is a part of the broker's, it grows while the broker first serves requests, and a
    process without such threads (this one) reads 0."""
    jit0 = jit_cpu_s(kafka.pid)
    config = unique_config(kafka.bootstrap, partitions=8)
    run(create_topics(kafka.bootstrap, [config.steps_topic], partitions=8))
    jit1, total = jit_cpu_s(kafka.pid), cpu_s(kafka.pid)
    assert 0 < jit0 <= jit1 < total  # compiled something at start (C1 at least), a part of the broker's CPU
    assert jit_cpu_s(os.getpid()) == 0.0
    assert jit_cpu_s(2**22 + 7) != jit_cpu_s(2**22 + 7)  # no such process: nan, not 0
