"""A second stage on the engine (tests/engine/counter_stage.py) keeps exactly-once under SIGKILL.

The counter stage runs in a subprocess against the real broker; it is SIGKILLed every
1.5-3 s while its input is published and restarted each time. Its output, read
``read_committed``, must hold each input record exactly once, each key's counts must
run 1..n with no gap or repeat (its state survived every restart), and every output
must sit on the partition the default partitioner picks over the output topic's own
partition count (which differs from the input's).
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import uuid
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

import pytest

from loopwarden.publisher import Publisher
from loopwarden.engine.assignment import partition_of
from tests.engine.topics import counter_topics
from tests.integration.harness import env_for, read_all, run, unique_config

pytestmark = pytest.mark.timeout(400)

IN_PARTITIONS, OUT_PARTITIONS = 4, 3
KEYS = 60


class Publishing:
    """Publishes ``total`` keyed messages in chunks, in the background, while the test kills the stage."""

    def __init__(self, bootstrap: str, topic: str, total: int) -> None:
        self.bootstrap, self.topic, self.total = bootstrap, topic, total
        self.sent: dict[bytes, int] = defaultdict(int)

    async def publish(self) -> None:
        async with Publisher(self.bootstrap) as pub:
            for i in range(self.total):
                key = b"key-%d" % (i * 7 % KEYS)
                self.sent[key] += 1
                await pub.publish_raw(self.topic, key, b"x")
                if i % 500 == 499:
                    await pub.flush()
                    await asyncio.sleep(0.3)
            await pub.publish_raw(self.topic, None, b"no key")  # dead-lettered, not counted
            await pub.flush()


def _start(env: dict, log: Path) -> subprocess.Popen:
    with open(log, "ab") as f:
        return subprocess.Popen([sys.executable, "-m", "tests.engine.counter_stage"], env=env, stdout=f,
                                stderr=subprocess.STDOUT)


@pytest.mark.parametrize("store,commit_offsets_ms,batch_wait_ms",
                         [("memory", 0, 5), ("rocksdb", 60_000, 5), ("memory", 50, 5), ("rocksdb", 60_000, 200)])
def test_a_counter_stage_on_the_engine_is_exactly_once_under_sigkill(kafka, tmp_path: Path, store: str,
                                                                     commit_offsets_ms: int, batch_wait_ms: int) -> None:
    """SIGKILLed every 1.5-3 s (>= 5 kills) while 6000 keyed records arrive: each input once in the output
    (read_committed), each key's counts 1..n, outputs on the default partitioner's partition. Also with the
    group's offsets committed once a minute: a restart resumes from the changelog's offsets record (RocksDB:
    kept in the local store, only the changelog's tail read), else it would count again what it counted; and
    every 50 ms by the consumer, off the pipelines: a kill lands between transactions and the group's commits; and
    with getmany waiting 200 ms, so that the loop's batch is often fetched (from the group's offset) while the
    partitions are owned and sought: a batch taken across the owning would be counted again."""
    tag = uuid.uuid4().hex[:8]
    config = replace(unique_config(kafka.bootstrap, partitions=IN_PARTITIONS), batch_max_records=300,
                     data_dir=str(tmp_path / "data"), store=store, commit_offsets_ms=commit_offsets_ms,
                     batch_wait_ms=batch_wait_ms)
    in_topic, out_topic = run(counter_topics(kafka.bootstrap, config.app_id, f"count-{tag}", IN_PARTITIONS,
                                             OUT_PARTITIONS))
    env = {**env_for(config), "LOOPWARDEN_COUNTER_IN": in_topic, "LOOPWARDEN_COUNTER_OUT": out_topic, "PYTHONPATH": os.getcwd()}
    publishing = Publishing(kafka.bootstrap, in_topic, 6000)
    log = tmp_path / "counter.log"
    proc = _start(env, log)
    kills = 0
    import threading

    thread = threading.Thread(target=lambda: run(publishing.publish()), daemon=True)
    thread.start()
    try:
        while kills < 5 or thread.is_alive():
            time.sleep(1.5 + (kills % 4) * 0.5)
            proc.kill()
            proc.wait(10)
            kills += 1
            proc = _start(env, log)
        thread.join(60)
        deadline = time.monotonic() + 180
        while True:
            records = run(read_all(config, out_topic))
            if len(records) >= 6000 or time.monotonic() > deadline:
                break
            time.sleep(1)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
    tail = log.read_text(errors="replace")[-3000:]
    sources = [r.value.split(b" ")[1] for r in records]
    seen: dict[bytes, list] = defaultdict(list)
    for r in records:
        seen[r.value.split(b" ")[1]].append((r.partition, r.offset, r.value))
    twice = sorted((v for v in seen.values() if len(v) > 1), key=lambda v: v[0][1])
    assert len(sources) == len(set(sources)) == 6000, (len(sources), len(set(sources)), twice[:3], twice[-3:], tail)
    counts: dict[bytes, list[int]] = defaultdict(list)
    for r in records:
        assert r.partition == partition_of(r.key, OUT_PARTITIONS), (r.key, r.partition)
        counts[r.key].append(int(r.value.split(b" ")[0]))
    for key, sent in publishing.sent.items():
        assert sorted(counts[key]) == list(range(1, sent + 1)), (key, sorted(counts[key])[:20])
    dead = run(read_all(config, f"{config.app_id}-dead"))
    assert [r.value for r in dead] == [b"no key"]
    assert kills >= 5
