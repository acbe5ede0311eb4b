"""Exactly-once on a real broker: kills mid-batch, a zombie worker, poison-sized messages, stalls.

Every check reads agent.health with ``isolation_level=read_committed``, as the contract
tells consumers to: each (run_id, seq) must be there exactly once, and every run in the
final state offline replay reaches on the same valid input.
"""

from __future__ import annotations

import json
import signal
import time
from collections import Counter
from pathlib import Path

import pytest
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

from loopwarden.simulate import fleet
from tests.faults.oracle import check, figures
from tests.integration.harness import (
    final_states,
    make_worker,
    publish,
    read_topic,
    run,
    sigkill_while_publishing,
    tick,
    transitions,
    unique_config,
    wait_consumed,
)
from tests.integration.test_processor import ADVANCE_MS, replay_final, wait_final

pytestmark = pytest.mark.timeout(400)


def assert_exactly_once(ts: list[dict], expected: dict[str, str]) -> None:
    """Every (run_id, seq) once, seq 1..n per run, and replay's final states."""
    keys = Counter((t["run_id"], t["seq"]) for t in ts)
    repeated = [k for k, n in keys.items() if n > 1]
    assert not repeated, f"{len(repeated)} repeated (run_id, seq), e.g. {repeated[:3]}"
    for run_id in expected:
        seqs = sorted(seq for r, seq in keys if r == run_id)
        assert seqs == list(range(1, len(seqs) + 1)), (run_id, seqs)
    got = final_states(ts)
    wrong = {r: (got.get(r), s) for r, s in expected.items() if got.get(r) != s}
    assert not wrong, f"{len(wrong)} runs not in replay's final state, e.g. {list(wrong.items())[:3]}"


def test_sigkill_every_few_seconds_while_a_fleet_is_published(kafka, tmp_path: Path) -> None:
    """A worker SIGKILLed every 1.5-3 s while a fleet is being published, restarted each time (>= 6 kills):
    agent.health (read_committed) holds every (run_id, seq) exactly once and every run ends as replay says."""
    config = unique_config(kafka.bootstrap)
    messages = fleet(4000, seed=17, bad_every=0)
    expected, last = replay_final(messages)
    worker, kills = sigkill_while_publishing(config, tmp_path, messages, chunk=500, min_kills=6, batch_max_records=500)
    try:
        run(tick(worker.config, last + ADVANCE_MS))
        ts = wait_final(worker.config, expected, timeout_s=240)
        fig = figures("worker SIGKILL", f"{kills} SIGKILLs while publishing, restarted each time", ts, expected)
        check(fig)
        assert_exactly_once(ts, expected)
    finally:
        worker.stop()


def test_a_zombie_worker_commits_nothing_for_partitions_it_lost(kafka, tmp_path: Path) -> None:
    """Worker A is paused (SIGSTOP) past its session timeout while a fleet is published; B takes its
    partitions; A resumes (SIGCONT) with a batch in flight. A's producers are fenced: agent.health
    still holds every (run_id, seq) once, and every run ends as replay says."""
    config = unique_config(kafka.bootstrap, partitions=4)
    a = make_worker(config, tmp_path, "a", clock="event", session_timeout_s=3.0, batch_max_records=200).start()
    b = make_worker(config, tmp_path, "b", clock="event", session_timeout_s=3.0, batch_max_records=200).start()
    messages = fleet(2000, seed=23, bad_every=0)
    expected, last = replay_final(messages)
    try:
        for w in (a, b):
            w.wait_ready()
        half = len(messages) // 2
        run(publish(config, [(m.topic, m.key, m.value) for m in messages[:half]]))
        assert a.proc is not None
        a.proc.send_signal(signal.SIGSTOP)
        try:
            run(publish(config, [(m.topic, m.key, m.value) for m in messages[half:]]))
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:  # B owns every partition once A's session expired
                status, body = b.get("/readyz")
                if status == 200 and json.loads(body)["partitions"] == [0, 1, 2, 3]:
                    break
                time.sleep(0.3)
            else:
                raise AssertionError(f"B never took A's partitions: {b.get('/readyz')}")
        finally:
            a.proc.send_signal(signal.SIGCONT)
        run(tick(config, last + ADVANCE_MS))
        ts = wait_final(config, expected, timeout_s=180)
        time.sleep(3)  # let A rejoin: whatever it commits now must not repeat anything
        ts = transitions(run(read_topic(config, config.health_topic, lambda r: False, timeout_s=5)))
        check(figures("pause", "worker SIGSTOPped past its session timeout, then SIGCONT", ts, expected))
        assert_exactly_once(ts, expected)
        parts = [set(json.loads(w.get("/readyz")[1])["partitions"]) for w in (a, b)]
        assert not parts[0] & parts[1]
    finally:
        a.stop()
        b.stop()


def test_a_message_too_large_to_dead_letter_does_not_stall_its_partition(kafka, tmp_path: Path) -> None:
    """A 1,000,100-byte message cannot be forwarded unchanged with error headers: it is dead-lettered
    cut to fit, with a header giving its original size and one giving its offset, and the runs
    behind it on the same partition are still classified."""
    config = unique_config(kafka.bootstrap, partitions=1)
    worker = make_worker(config, tmp_path, clock="event").start()
    try:
        messages = fleet(30, seed=8, bad_every=0)
        expected, last = replay_final(messages)
        huge = b'{"type":"run_started","pad":"' + b"x" * (1_000_100 - 40) + b'"}'
        msgs = [("steps", b"huge-run", huge)] + [(m.topic, m.key, m.value) for m in messages]
        run(publish(worker.config, msgs))
        run(tick(worker.config, last + ADVANCE_MS))
        assert final_states(wait_final(worker.config, expected, timeout_s=90)) == expected
        dead = run(read_topic(worker.config, worker.config.deadletter_topic, lambda r: len(r) >= 1, 30))
        assert len(dead) == 1
        headers = {k: v.decode() for k, v in dead[0].headers}
        assert headers["error_reason"] == "too_large"
        assert int(headers["truncated"]) == len(huge)
        assert headers["source_offset"] == "0"
        assert len(dead[0].value) < len(huge) and huge.startswith(dead[0].value)
    finally:
        worker.stop()


async def _small_health_topic(config, max_bytes: int) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=config.bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(config.health_topic, 1, 1, topic_configs={"max.message.bytes": str(max_bytes)})])
    finally:
        await admin.close()


async def _set_max_bytes(config, max_bytes: int) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=config.bootstrap)
    await admin.start()
    try:
        await admin.alter_configs([ConfigResource(ConfigResourceType.TOPIC, config.health_topic,
                                                  {"max.message.bytes": str(max_bytes)})])
    finally:
        await admin.close()


def _metric(worker, name: str) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    body = worker.get("/metrics")[1].decode()
    return sum(s.value for f in text_string_to_metric_families(body) for s in f.samples if s.name == name)


def test_lag_and_readyz_report_a_stalled_partition(kafka, tmp_path: Path) -> None:
    """While every transaction of a partition fails (here: agent.health refuses messages that large),
    its lag stays up, /readyz answers 503 and the stall is counted; once the topic accepts them the
    partition catches up, lag returns to 0 and /readyz to 200."""
    config = unique_config(kafka.bootstrap, partitions=1)
    run(_small_health_topic(config, 200))  # a transition is ~700 bytes
    worker = make_worker(config, tmp_path, clock="event", stall_timeout_s=3.0).start()
    try:
        messages = fleet(20, seed=5, bad_every=0)
        expected, last = replay_final(messages)
        run(publish(worker.config, [(m.topic, m.key, m.value) for m in messages]))
        deadline = time.monotonic() + 60
        while worker.get("/readyz")[0] != 503:
            assert time.monotonic() < deadline, worker.log_tail()
            time.sleep(0.3)
        assert _metric(worker, "loopwarden_stalls_total") >= 1
        assert _metric(worker, "loopwarden_stalled_partitions") == 1
        assert _metric(worker, "loopwarden_consumer_lag") > 0
        assert _metric(worker, "loopwarden_transactions_total") >= 1
        run(_set_max_bytes(config, 1_000_000))
        run(tick(worker.config, last + ADVANCE_MS))
        assert final_states(wait_final(worker.config, expected, timeout_s=90)) == expected
        deadline = time.monotonic() + 30
        while worker.get("/readyz")[0] != 200 or _metric(worker, "loopwarden_consumer_lag") != 0:
            assert time.monotonic() < deadline, (worker.get("/readyz"), worker.log_tail())
            time.sleep(0.3)
        assert _metric(worker, "loopwarden_stalled_partitions") == 0
    finally:
        worker.stop()


def test_an_idle_partition_whose_events_arrive_late_is_not_stalled(kafka, tmp_path: Path) -> None:
    """A worker idle for longer than its stall timeout, whose events then arrive and are processed at
    once, logs no stall and counts none: a stall is lag without progress, not a quiet input. Its log,
    from a healthy start on, holds no ERROR at all (aiokafka's retried leader and coordinator elections
    included)."""
    config = unique_config(kafka.bootstrap, partitions=1)
    worker = make_worker(config, tmp_path, clock="event", stall_timeout_s=2.0).start()
    try:
        time.sleep(4.0)  # idle: twice the stall timeout with nothing to read
        messages = fleet(5, seed=3, bad_every=0)
        run(publish(worker.config, [(m.topic, m.key, m.value) for m in messages]))
        wait_consumed(worker, len(messages), timeout_s=60)
        time.sleep(1.0)  # a few more turns of the loop, with the lag gone
        assert _metric(worker, "loopwarden_stalls_total") == 0, worker.log_tail()
        log = worker.log_path.read_text(errors="replace")
        assert "stalled" not in log and " ERROR " not in log, log
    finally:
        worker.stop()
