"""The group's committed offsets with ``commit_offsets_ms``: behind while the worker runs, exact once it stops or idles."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition

from loopwarden.simulate import fleet
from loopwarden.engine.recovery import decode_offsets
from loopwarden.engine.store import OFFSETS_KEY
from tests.integration.harness import (group_offsets, make_worker, publish, run, stable_end_offsets, unique_config,
                                      wait_consumed)

pytestmark = pytest.mark.timeout(240)


async def _committed(config, topic: str) -> int:
    return sum((await group_offsets(config, topic)).values())


async def _changelog(config, topic: str) -> dict[int, int]:
    """partition -> ``topic``'s offset in the changelog's last committed input-offsets record (0: none), read once
    every transaction on the changelog when called has its markers (the group's offsets, committed after EndTxn,
    could otherwise be seen ahead of it for a moment: ``stable_end_offsets``; recovery never reads in that moment,
    the producer it starts first completes the transaction)."""
    tps = [TopicPartition(config.changelog_topic, p) for p in range(config.partitions)]
    ends = await stable_end_offsets(config.broker, tps)
    consumer = AIOKafkaConsumer(bootstrap_servers=config.broker, group_id=None, enable_auto_commit=False,
                                isolation_level="read_committed", auto_offset_reset="earliest")
    await consumer.start()
    try:
        consumer.assign(tps)
        last = {p: 0 for p in range(config.partitions)}
        while [tp for tp in tps if await consumer.position(tp) < ends[tp]]:
            for tp, records in (await consumer.getmany(timeout_ms=500)).items():
                for r in records:
                    if r.key == OFFSETS_KEY and r.offset < ends[tp]:
                        last[tp.partition] = decode_offsets(r.value).get(topic, 0)
        return last
    finally:
        await consumer.stop()


def _send(worker, messages: list) -> None:
    run(publish(worker.config, [(m.topic, m.key, m.value) for m in messages]))


def _wait_caught_up(worker, counts: dict[str, int], timeout_s: float, what: str) -> None:
    """Until the group's committed offsets on each topic of ``counts`` sum to its count; ``what`` names a timeout."""
    deadline = time.monotonic() + timeout_s
    while True:
        committed = {topic: run(_committed(worker.config, topic)) for topic in counts}
        if all(committed[t] >= n for t, n in counts.items()):
            return
        assert time.monotonic() < deadline, f"{what}: {committed} of {counts}"
        time.sleep(0.5)


def test_the_groups_offsets_lag_while_busy_and_are_exact_after_a_clean_stop(kafka, tmp_path: Path) -> None:
    """Once a minute: after a second batch they are behind what was consumed; a SIGTERM commits them to the end."""
    config = unique_config(kafka.bootstrap)
    worker = make_worker(config, tmp_path, clock="event", commit_offsets_ms=60_000).start()
    messages = fleet(200, seed=31, bad_every=0)
    half = len(messages) // 2
    steps = sum(1 for m in messages if m.topic == "steps")
    try:
        _send(worker, messages[:half])
        wait_consumed(worker, half)
        _send(worker, messages[half:])
        wait_consumed(worker, len(messages))
        assert run(_committed(worker.config, worker.config.steps_topic)) < steps
    finally:
        worker.stop(signal.SIGTERM)
    assert run(_committed(worker.config, worker.config.steps_topic)) == steps


def test_the_groups_offsets_of_an_idle_worker_catch_up_within_the_interval(kafka, tmp_path: Path) -> None:
    """commit_offsets_ms=1500: a few seconds after the last input the group's offsets are at the end (lag 0)."""
    config = unique_config(kafka.bootstrap)
    worker = make_worker(config, tmp_path, clock="event", commit_offsets_ms=1500).start()
    messages = fleet(150, seed=37, bad_every=0)
    steps = sum(1 for m in messages if m.topic == "steps")
    try:
        for i in range(0, len(messages), 50):
            _send(worker, messages[i:i + 50])
            time.sleep(0.3)
        wait_consumed(worker, len(messages))
        _wait_caught_up(worker, {worker.config.steps_topic: steps}, 30,
                        "the group's offsets never caught up with an idle worker")
    finally:
        worker.stop()


def test_after_a_sigkill_the_groups_offsets_catch_up_from_the_changelog_with_no_new_input(kafka, tmp_path: Path) -> None:
    """Killed while the group's offsets were behind: the restarted worker seeks to the changelog's and, with
    nothing more to consume, brings the group's there too (lag 0; settling after an expansion reads them)."""
    config = unique_config(kafka.bootstrap)
    worker = make_worker(config, tmp_path, clock="event", commit_offsets_ms=60_000).start()
    messages = fleet(200, seed=41, bad_every=0)
    half = len(messages) // 2
    steps = sum(1 for m in messages if m.topic == "steps")
    _send(worker, messages[:half])
    wait_consumed(worker, half)
    _send(worker, messages[half:])
    wait_consumed(worker, len(messages))
    worker.stop(signal.SIGKILL)
    assert run(_committed(worker.config, worker.config.steps_topic)) < steps  # behind: the changelog has the rest
    worker = make_worker(config, tmp_path, clock="event", commit_offsets_ms=1000).start()
    try:
        _wait_caught_up(worker, {worker.config.steps_topic: steps}, 30,
                        "the group's offsets stayed behind the changelog's after a restart")
    finally:
        worker.stop()


def test_the_groups_offsets_never_pass_the_changelogs_while_the_worker_commits_them(kafka, tmp_path: Path) -> None:
    """Committed by the consumer every 100 ms while batches go: each partition's group offset, read first, is at
    most the changelog's record read after it (recovery takes the further one); equal once the worker stops."""
    config = unique_config(kafka.bootstrap)
    worker = make_worker(config, tmp_path, clock="event", commit_offsets_ms=100).start()
    messages = fleet(300, seed=43, bad_every=0)
    topic = config.steps_topic
    samples = []
    try:
        for i in range(0, len(messages), len(messages) // 8):
            _send(worker, messages[i:i + len(messages) // 8])
            time.sleep(0.2)
            group = run(group_offsets(worker.config, topic))
            samples.append((group, run(_changelog(worker.config, topic))))
        wait_consumed(worker, len(messages))
    finally:
        worker.stop(signal.SIGTERM)
    for group, changelog in samples:
        assert all(group[p] <= changelog[p] for p in group), (group, changelog)
    assert any(sum(group.values()) for group, _ in samples[:-1])  # the group's offsets moved while it ran
    final = run(group_offsets(worker.config, topic))
    assert final == run(_changelog(worker.config, topic))
    assert sum(final.values()) == sum(1 for m in messages if m.topic == "steps")


def test_an_idle_workers_group_offsets_catch_up_on_both_inputs(kafka, tmp_path: Path) -> None:
    """Receipts folded in one transaction, steps only in the later ones, then idle: the group's offsets of both
    inputs still reach the end (bench e waited 40 s on a worker 1,500-4,700 receipts short of the end in 4 of 10
    rounds when the group's offsets went inside transactions, of the batch's topics only)."""
    config = unique_config(kafka.bootstrap)
    # Transactions of a partition >= 1 s apart; the group's offsets committed every 1.5 s at most.
    worker = make_worker(config, tmp_path, clock="event", commit_offsets_ms=1500, commit_gap_ms=1000).start()
    messages = fleet(200, seed=43, bad_every=0)
    half = len(messages) // 2
    first, rest = messages[:half], messages[half:]
    receipts = [m for m in rest if m.topic == "outcomes"]
    steps = [m for m in rest if m.topic == "steps"]
    n_outcomes = sum(1 for m in messages if m.topic == "outcomes")
    n_steps = len(messages) - n_outcomes

    try:
        _send(worker, first)
        wait_consumed(worker, len(first))
        time.sleep(3)  # idle: the group's offsets caught up
        _send(worker, steps[:60])  # then steps only
        wait_consumed(worker, len(first) + 60)
        _send(worker, receipts)  # receipts only, >= 1 s later (commit_gap_ms): a transaction of their own
        wait_consumed(worker, len(first) + 60 + len(receipts))
        _send(worker, steps[60:])  # steps only again, then nothing more
        wait_consumed(worker, len(messages))
        _wait_caught_up(worker, {worker.config.steps_topic: n_steps, worker.config.outcomes_topic: n_outcomes}, 15,
                        "the group's offsets of an idle worker stayed behind")
    finally:
        worker.stop()


def test_with_commit_offsets_ms_0_the_transactions_carry_the_groups_offsets_of_every_input(kafka, tmp_path: Path) -> None:
    """commit_offsets_ms=0 (older workers in the group): the group's offsets go inside every transaction, of both
    inputs, and the consumer commits none of them (loopwarden_group_commits_total stays at 0)."""
    from prometheus_client.parser import text_string_to_metric_families

    config = unique_config(kafka.bootstrap)
    worker = make_worker(config, tmp_path, clock="event", commit_offsets_ms=0).start()
    messages = fleet(150, seed=47, bad_every=0)
    counts = {worker.config.steps_topic: sum(1 for m in messages if m.topic == "steps"),
              worker.config.outcomes_topic: sum(1 for m in messages if m.topic == "outcomes")}
    try:
        _send(worker, messages)
        wait_consumed(worker, len(messages))
        _wait_caught_up(worker, counts, 15, "the transactions did not carry the group's offsets")
        status, body = worker.get("/metrics", worker.config.token)
        assert status == 200, body
        by_consumer = [s.value for f in text_string_to_metric_families(body.decode())
                       if f.name == "loopwarden_group_commits" for s in f.samples if s.name.endswith("_total")]
        assert sum(by_consumer) == 0, by_consumer
    finally:
        worker.stop()
