"""`loopwarden actions` against the real broker and a real local HTTPS receiver: every action committed on
agent.actions is delivered, signed, when due, through 500s, an outage of the receiver and the deliverer's own
crash; a repeat carries the same action_id and body."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

import pytest
from aiokafka import AIOKafkaProducer
from prometheus_client.parser import text_string_to_metric_families

from dev.localkafka import free_port
from loopwarden.codecs import encode
from loopwarden.codecs.events import RecoveryAction
from tests.integration.harness import create_topic
from tests.integration.webhook_receiver import Receiver

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

SECRET = b"a-shared-secret-of-32-bytes-long"


def action(i: int, tag: str, now_ms: int, backoff_ms: int = 0) -> RecoveryAction:
    job = f"job-{tag}-{i}"
    if i % 5 == 4:  # every fifth: the bound was reached
        return RecoveryAction(action_id=f"{job}-a3:9", run_id=f"{job}-a3", agent="invoices", job_id=job, attempt=3, next_attempt=None,
                              action="escalate", reason="attempts_exhausted", ts=now_ms, not_before_ts=now_ms,
                              next_policy=None, escalate_to="oncall-invoices", decided_by="policy:v1")
    return RecoveryAction(action_id=f"{job}:4", run_id=job, agent="invoices", job_id=job, attempt=1, next_attempt=2, action="resume",
                          reason="STUCK:inactivity_timeout", ts=now_ms, not_before_ts=now_ms + backoff_ms,
                          next_policy=None, escalate_to=None, decided_by="policy:v1")


async def produce(bootstrap: str, topic: str, actions: list[RecoveryAction], aborted: list[RecoveryAction] = ()) -> None:
    """As the worker does: in transactions, keyed by job_id; ``aborted`` in a transaction that is aborted."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, transactional_id=f"test-{uuid.uuid4().hex[:8]}")
    await producer.start()
    try:
        if aborted:
            await producer.begin_transaction()
            for a in aborted:
                await producer.send(topic, encode(a), key=a.job_id.encode())
            await producer.flush()
            await producer.abort_transaction()
        for start in range(0, len(actions), 25):
            async with producer.transaction():
                for a in actions[start:start + 25]:
                    await producer.send(topic, encode(a), key=a.job_id.encode())
    finally:
        await producer.stop()


def loaded(kafka, tmp_path: Path, actions_of, aborted: int = 0) -> tuple[str, str, list, list, Receiver]:
    """A topic of its own holding the actions ``actions_of(tag, now_ms)`` makes (in committed transactions, and
    ``aborted`` more in an aborted one), and a receiver up: (tag, topic, actions, aborted actions, receiver)."""
    tag = uuid.uuid4().hex[:8]
    topic, now = f"actions-{tag}", int(time.time() * 1000)
    actions, dropped = actions_of(tag, now), [action(i, "aborted" + tag, now) for i in range(aborted)]
    asyncio.run(create_topic(kafka.bootstrap, topic, 3))
    asyncio.run(produce(kafka.bootstrap, topic, actions, dropped))
    return tag, topic, actions, dropped, Receiver(tmp_path, SECRET, free_port()).up()


def deliverer(bootstrap: str, topic: str, group: str, receiver: Receiver, tmp: Path, metrics_port: int) -> subprocess.Popen:
    secret = tmp / "secret"
    secret.write_bytes(SECRET + b"\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOOPWARDEN_")}
    return subprocess.Popen(
        [sys.executable, "-m", "loopwarden.cli", "actions", "--broker", bootstrap, "--actions-topic", topic,
         "--group", group, "--webhook", receiver.url, "--secret-file", str(secret), "--ca-file", str(receiver.cert),
         "--max-backoff-s", "1", "--timeout-s", "2", "--metrics-port", str(metrics_port)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for(check, timeout_s: float, proc: subprocess.Popen, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if proc.poll() is not None:
            raise AssertionError(f"the deliverer exited ({proc.returncode}): {proc.stderr.read()}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


def metrics(port: int) -> dict[tuple[str, tuple], float]:
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(body) for s in f.samples}


def stop(proc: subprocess.Popen) -> str:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        _, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
    return err


def assert_repeats_are_the_same_action(receiver: Receiver) -> None:
    first: dict[str, bytes] = {}
    for r in receiver.requests:
        assert r.signed, f"request for {r.action_id} not signed with the shared secret"
        assert r.header_id == r.action_id
        assert first.setdefault(r.action_id, r.body) == r.body, f"{r.action_id} repeated with another body"


def test_every_action_is_delivered_through_500s_and_a_10_s_outage_of_the_receiver(kafka, tmp_path: Path) -> None:
    """The receiver answers 500, then is down for 10 s: every committed action arrives, signed, none early,
    none lost, none from an aborted transaction; repeats carry the same action_id and body."""
    tag, topic, actions, aborted, receiver = loaded(
        kafka, tmp_path, aborted=5,
        actions_of=lambda tag, now: [action(i, tag, now, backoff_ms=6_000 if i % 7 == 0 else 0) for i in range(60)])
    receiver.status = 500
    port = free_port()
    proc = deliverer(kafka.bootstrap, topic, f"g-{tag}", receiver, tmp_path, port)
    try:
        wait_for(lambda: len(receiver.requests) >= 60, 90, proc, "the first requests (answered 500)")
        receiver.down()
        down_at = time.time()
        time.sleep(10)
        receiver.status = 200
        receiver.up()
        wait_for(lambda: len(receiver.delivered()) >= 60, 120, proc, "every action delivered")
        time.sleep(2)  # anything still in flight lands, and nothing else may come
        seen = metrics(port)
    finally:
        err = stop(proc)
        receiver.close()
    delivered = receiver.delivered()
    assert "Traceback" not in err, err
    assert set(delivered) == {a.action_id for a in actions}, err
    assert all(r.status == 200 for r in delivered.values())
    assert not {r.action_id for r in receiver.requests} & {a.action_id for a in aborted}
    assert all(r.at >= down_at + 10 for r in delivered.values()), "a 2xx before the receiver came back"
    for a in actions:
        assert delivered[a.action_id].at * 1000 >= a.not_before_ts, f"{a.action_id} delivered before it was due"
    assert_repeats_are_the_same_action(receiver)
    assert seen[("loopwarden_actions_delivered_total", (("action", "resume"),))] == 48
    assert seen[("loopwarden_actions_delivered_total", (("action", "escalate"),))] == 12
    assert seen[("loopwarden_actions_escalations_total",
                 (("escalate_to", "oncall-invoices"), ("reason", "attempts_exhausted")))] == 12
    assert seen[("loopwarden_actions_delivery_failures_total", (("why", "status_5xx"),))] >= 60
    assert seen[("loopwarden_actions_delivery_failures_total", (("why", "connection"),))] > 0
    assert seen[("loopwarden_actions_pending", ())] == 0


def test_a_deliverer_killed_mid_stream_delivers_the_rest_when_restarted(kafka, tmp_path: Path) -> None:
    """SIGKILL while delivering: the restarted deliverer (same group) delivers every action not yet taken,
    from the committed offsets, repeating only actions whose delivery was not committed, with their own id."""
    tag, topic, actions, _, receiver = loaded(kafka, tmp_path,
                                              lambda tag, now: [action(i, tag, now) for i in range(400)])
    receiver.delay_s = 0.1  # about 160 a second with the deliverer's 16 at once: the kill lands mid-stream
    proc = deliverer(kafka.bootstrap, topic, f"g-{tag}", receiver, tmp_path, free_port())
    try:
        wait_for(lambda: len(receiver.delivered()) >= 100, 90, proc, "a hundred deliveries")
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        before = len(receiver.requests)
        assert before < 400, "the kill came after the last delivery: nothing left to show"
        proc = deliverer(kafka.bootstrap, topic, f"g-{tag}", receiver, tmp_path, free_port())
        wait_for(lambda: len(receiver.delivered()) >= 400, 120, proc, "every action delivered after the restart")
        time.sleep(2)
    finally:
        err = stop(proc)
        receiver.close()
    assert "Traceback" not in err, err
    assert set(receiver.delivered()) == {a.action_id for a in actions}, err
    assert_repeats_are_the_same_action(receiver)
    after = len(receiver.requests) - before
    assert after < 400, f"the restart posted {after} actions: it did not start from committed offsets"


def test_a_second_deliverer_joining_mid_stream_takes_partitions_over_without_losing_an_action(kafka, tmp_path: Path) -> None:
    """A rebalance moves partitions while their actions are in flight: the first deliverer commits what was
    delivered and drops the rest, the second posts the rest; every action arrives, repeats with their own id."""
    tag, topic, actions, _, receiver = loaded(kafka, tmp_path,
                                              lambda tag, now: [action(i, tag, now) for i in range(400)])
    receiver.delay_s = 0.5  # about 30 a second: the rebalance lands mid-stream
    first = deliverer(kafka.bootstrap, topic, f"g-{tag}", receiver, tmp_path, free_port())
    second, port = None, free_port()
    try:
        wait_for(lambda: len(receiver.delivered()) >= 60, 90, first, "sixty deliveries")
        second = deliverer(kafka.bootstrap, topic, f"g-{tag}", receiver, tmp_path, port)
        wait_for(lambda: len(receiver.delivered()) >= 400, 120, second, "every action delivered after the rebalance")
        assert first.poll() is None, first.stderr.read()
        time.sleep(2)
        by_second = sum(v for (name, _), v in metrics(port).items() if name == "loopwarden_actions_delivered_total")
    finally:
        errs = [stop(p) for p in (first, second) if p is not None]
        receiver.close()
    assert all("Traceback" not in err for err in errs), errs
    assert 0 < by_second < 400, f"the second deliverer delivered {by_second}: no partition moved mid-stream"
    assert set(receiver.delivered()) == {a.action_id for a in actions}
    assert_repeats_are_the_same_action(receiver)


def test_a_missing_actions_topic_is_one_line_naming_it(kafka, tmp_path: Path) -> None:
    """The deliverer never creates the topic: a wrong --actions-topic stops it at start in one line."""
    receiver = Receiver(tmp_path, SECRET, free_port())
    try:
        proc = deliverer(kafka.bootstrap, "no-such-actions-topic", "g-missing", receiver, tmp_path, 0)
        _, err = proc.communicate(timeout=120)
    finally:
        receiver.close()
    assert proc.returncode == 1
    assert err.strip().splitlines() == ["loopwarden actions: topic no-such-actions-topic does not exist (check "
                                        "--actions-topic / LOOPWARDEN_ACTIONS_TOPIC; a worker creates it)"], err
