"""An input topic deleted and created again while the workers were stopped: read from its beginning, not skipped.

The changelog's input-offsets record outlives the topic (the group's offsets of a deleted topic go with
it); before marks (loopwarden/engine/marks.py) a worker resumed the new topic at the old topic's offsets
and skipped everything its producers had written below them, without a word: 60 runs of the test's 100 seen.
"""

from __future__ import annotations

import asyncio
import time
import zlib

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin.records_to_delete import RecordsToDelete

from loopwarden.engine.marks import recreated
from loopwarden.stages.topics import repair
from tests.builders import ended, started, step
from tests.integration.harness import (
    as_json,
    delete_topic,
    events_consumed,
    group_offsets,
    make_worker,
    publish,
    read_topic,
    run,
    stable_end_offsets,
    transitions,
    unique_config,
    wait_consumed,
)

pytestmark = pytest.mark.timeout(300)
PARTITIONS = 2


def _fleet(prefix: str, n: int, t0: int) -> list[tuple]:
    return [("steps", f"{prefix}{i}".encode(), as_json(e)) for i in range(n) for e in (
        started(run=f"{prefix}{i}", ts=t0), step(0, run=f"{prefix}{i}", ts=t0 + 1),
        ended("natural_finish", 1, run=f"{prefix}{i}", ts=t0 + 2))]


def _verifying(config, prefix: str, n: int) -> set[str]:
    def done(recs) -> bool:
        return len({t["run_id"] for t in transitions(recs) if t["run_id"].startswith(prefix)
                    and t["to_state"] == "VERIFYING"}) == n
    recs = run(read_topic(config, config.health_topic, done, timeout_s=90))
    return {t["run_id"] for t in transitions(recs) if t["run_id"].startswith(prefix) and t["to_state"] == "VERIFYING"}


def _ends(config, topic: str) -> dict[int, int]:
    ends = run(stable_end_offsets(config.broker, [TopicPartition(topic, p) for p in range(PARTITIONS)]))
    return {tp.partition: o for tp, o in ends.items()}


def test_an_input_topic_created_again_while_the_workers_were_stopped_is_read_from_its_beginning(kafka, tmp_path):
    """30 runs consumed and committed; a plain restart then reads only what came after them (no warning, 30
    more events consumed, not 120); agent.steps deleted and created again, its producers write 100 runs (past
    the old offsets on every partition), a worker starts: it warns, per partition, that the topic is a new one
    and folds all 100 runs, having consumed exactly their 300 events."""
    config = unique_config(kafka.bootstrap, partitions=PARTITIONS)
    t0 = int(time.time() * 1000)
    worker = make_worker(config, tmp_path, "w").start()
    try:
        run(publish(config, _fleet("old-", 30, t0)))
        assert len(_verifying(config, "old-", 30)) == 30
        wait_consumed(worker, 90)
    finally:
        worker.stop()

    run(publish(config, _fleet("mid-", 10, t0)))
    worker = make_worker(config, tmp_path, "w").start()
    try:
        assert len(_verifying(config, "mid-", 10)) == 10
        wait_consumed(worker, 30)
        time.sleep(1)
        assert events_consumed(worker) == 30  # resumed where the last transaction stopped
    finally:
        worker.stop()
    assert "deleted and created again" not in worker.log_path.read_text()

    old_ends = _ends(config, config.steps_topic)
    assert run(group_offsets(config, config.steps_topic)) == old_ends
    run(delete_topic(config, config.steps_topic))
    run(repair(config, []))
    assert run(group_offsets(config, config.steps_topic)) == {p: 0 for p in range(PARTITIONS)}  # gone with it
    run(publish(config, _fleet("new-", 100, t0 + 10)))
    new_ends = _ends(config, config.steps_topic)
    assert all(new_ends[p] >= old_ends[p] for p in range(PARTITIONS)), (old_ends, new_ends)  # the case that skipped

    log_before = len(worker.log_path.read_text())
    worker = make_worker(config, tmp_path, "w").start()
    try:
        assert len(_verifying(config, "new-", 100)) == 100
        wait_consumed(worker, 300)
        time.sleep(1)
        assert events_consumed(worker) == 300
    finally:
        worker.stop()
    log = worker.log_path.read_text()[log_before:]
    for p in range(PARTITIONS):
        assert (f"{config.steps_topic}[{p}]: the record consumed at offset {old_ends[p] - 1}" in log
                and "the topic was deleted and created again; reading it from its beginning, offset 0, "
                    f"not from {old_ends[p]}" in log), log[-3000:]


def test_a_mark_is_checked_against_the_record_at_its_offset(kafka) -> None:
    """``marks.recreated`` on a real partition of 5 records (offsets 0-4): the mark of the record there matches;
    another timestamp or key does not (what is there is named); a mark past the end does not (the end is named);
    a mark below the log's start (retention took it) is not checked; the reader is left assigned nothing."""
    config = unique_config(kafka.bootstrap, partitions=1)
    run(repair(config, []))
    run(publish(config, [("steps", f"r{i}".encode(), as_json(started(run=f"r{i}", ts=1000 + i))) for i in range(5)]))
    tp = TopicPartition(config.steps_topic, 0)

    async def check(marks: dict) -> dict:
        reader = AIOKafkaConsumer(bootstrap_servers=config.broker, group_id=None, isolation_level="read_committed")
        await reader.start()
        try:
            found = await recreated(reader, marks)
            assert reader.assignment() == set()
            return found
        finally:
            await asyncio.wait_for(reader.stop(), 10)  # it once hung here (marks.recreated says why)

    async def record_at(offset: int):
        consumer = AIOKafkaConsumer(bootstrap_servers=config.broker, group_id=None)
        await consumer.start()
        try:
            consumer.assign([tp])
            consumer.seek(tp, offset)
            return (await consumer.getmany(tp, timeout_ms=5000, max_records=1))[tp][0]
        finally:
            await consumer.stop()

    rec = run(record_at(3))
    mark = (3, rec.timestamp, zlib.crc32(b"r3"))
    assert run(check({tp: mark})) == {}
    assert run(check({tp: (3, rec.timestamp + 1, mark[2])})) == {
        tp: (0, f"offset 3 holds a record of timestamp {rec.timestamp}")}
    assert run(check({tp: (3, rec.timestamp, zlib.crc32(b"r4"))}))[tp][0] == 0
    assert run(check({tp: (7, rec.timestamp, mark[2])})) == {tp: (0, "the partition ends at offset 5")}

    async def delete_before(offset: int) -> None:
        admin = AIOKafkaAdminClient(bootstrap_servers=config.broker)
        await admin.start()
        try:
            await admin.delete_records({tp: RecordsToDelete(before_offset=offset)})
        finally:
            await admin.close()

    run(delete_before(4))
    assert run(check({tp: (3, rec.timestamp + 1, 0)})) == {}  # below the log's start: not checked
