"""Output topics that vanish while the worker runs: agent.health deleted (and auto-created by the broker), then mended.

Deleting agent.health loses what it held: that is the operator's act, not the worker's. What must
hold is that the worker notices (``/readyz`` 503 naming the topic), hangs in no transaction, and from
the moment the topic is back with its layout loses and repeats nothing: every run's transitions on
the re-created topic are a gap-free run of seqs ending where offline replay ends, each once (a run
started after the topic is back: all of them from seq 1). A transition committed to the auto-created
one-partition topic before the check noticed it goes with that topic when the operator deletes it.
"""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient

from loopwarden.codecs import decode_input
from loopwarden.replay import Replay
from loopwarden.engine.exceptions import TopicLayoutError
from loopwarden.stages.topics import existing_counts, records_held, repair
from tests.builders import ended, started, step
from tests.integration.harness import (
    as_json,
    delete_topic,
    make_worker,
    publish,
    read_topic,
    run,
    transitions,
    unique_config,
    wait_for,
)

pytestmark = pytest.mark.timeout(400)

RUNS = 40


async def _admin(config, action):
    admin = AIOKafkaAdminClient(bootstrap_servers=config.broker)
    await admin.start()
    try:
        return await action(admin)
    finally:
        await admin.close()


async def _mend(config, topic: str, calls: int = 6) -> None:
    """What docs/topics.md tells the operator: `loopwarden topics repair --recreate-outputs --yes`, and again
    when it says it lost its race to a client that auto-created the topic: a worker's producer whose sends wait
    for a partition of the deleted topic asks for it every few ms until it is back (aiokafka cannot close a
    producer without delivering what it holds; `loopwarden_producers_stopping` counts them)."""
    for _ in range(calls - 1):
        try:
            await repair(config, [topic])
            return
        except TopicLayoutError as exc:
            if "came back with the broker's default count" not in str(exc):
                raise
            await asyncio.sleep(1)
    await repair(config, [topic])


async def _send(config, events: list[dict]) -> None:
    async with AIOKafkaProducer(bootstrap_servers=config.broker, acks="all") as producer:
        for i, e in enumerate(events):
            await producer.send(config.steps_topic, as_json(e), key=e["run_id"].encode())
            if i % 20 == 19:
                await asyncio.sleep(0.05)


async def _auto_create(config, topic: str) -> None:
    """What any client asking for ``topic``'s metadata does on a broker with auto.create.topics.enable: its default count.

    Called just after ``delete_topics``: the broker applies a deletion to its metadata a little after the
    controller answers, so a metadata request at once may still see the old topic (and create nothing), and
    the worker's own producers may create it first. It asks only while the topic is missing, and returns once
    the topic is back with the broker's default count, 1."""
    counts: dict[str, int] = {}
    for _ in range(100):
        counts = await _admin(config, lambda admin: existing_counts(admin, [topic]))  # never creates it
        if counts.get(topic) == 1:
            return
        if topic not in counts:
            try:
                async with AIOKafkaProducer(bootstrap_servers=config.broker) as producer:
                    await producer.partitions_for(topic)
            except Exception:  # noqa: BLE001 - not there yet
                pass
        await asyncio.sleep(0.1)
    raise AssertionError(f"{topic} not back with 1 partition 10 s after it was deleted: {counts}")


def _said(worker):
    """For wait_for's ``why``: what the worker's /readyz answers now, and the end of its log."""
    return lambda: f"/readyz {worker.get('/readyz')}\n{worker.log_tail()}"


def test_agent_health_deleted_while_running_blocks_clearly_and_recovers_once_it_is_back(kafka, tmp_path) -> None:
    """agent.health deleted (auto-created with 1 partition) under transactions: /readyz 503 naming it; once the
    operator's delete + `topics repair` bring it back it recovers by itself, each run's seqs gap-free and once."""
    config = unique_config(kafka.bootstrap, partitions=4)
    worker = make_worker(config, tmp_path, "w", topology_check_s=1).start()
    t0 = int(time.time() * 1000) - 10_000
    early = [f"early-{i}" for i in range(RUNS)]
    late = [f"late-{i}" for i in range(RUNS)]
    before = [e for r in early for e in (started(run=r, ts=t0), step(0, ("lookup", "result"), run=r, ts=t0 + 100))]
    middle = [f"middle-{i}" for i in range(RUNS * 4)]
    # Runs starting while the topic goes: their RUNNING transitions are in transactions to agent.health.
    during = [e for r in middle for e in (started(run=r, ts=t0 + 200), step(0, run=r, ts=t0 + 250))]
    after = ([ended("natural_finish", 1, run=r, ts=t0 + 300) for r in early + middle]
             + [e for r in late for e in (started(run=r, ts=t0 + 400), step(0, run=r, ts=t0 + 450),
                                          ended("natural_finish", 1, run=r, ts=t0 + 500))])
    try:
        run(publish(config, [("steps", e["run_id"].encode(), as_json(e)) for e in before]))
        run(read_topic(config, config.health_topic,
                       lambda recs: len({t["run_id"] for t in transitions(recs)}) == RUNS))

        async def delete_while_sending() -> None:  # transactions in flight when the topic goes
            sending = asyncio.create_task(_send(config, during))  # not `publish`: it creates missing topics
            await asyncio.sleep(0.5)
            await _admin(config, lambda admin: admin.delete_topics([config.health_topic]))
            await _auto_create(config, config.health_topic)
            await sending

        run(delete_while_sending())
        deleted_at = time.monotonic()
        status, body = wait_for(lambda: (lambda r: r if r[0] == 503 and b"layout" in r[1] else None)(worker.get("/readyz")),
                                why=_said(worker))
        layout = json.loads(body)["layout"]
        assert layout and config.health_topic in layout, body
        assert time.monotonic() - deleted_at < 15
        assert b"loopwarden_topology_blocked 1.0" in worker.get("/metrics")[1]
        time.sleep(3)  # blocked, not hung: it keeps answering and its state does not flip back
        assert worker.get("/readyz")[0] == 503
        run(_mend(config, config.health_topic))
        assert run(_admin(config, lambda a: existing_counts(a, [config.health_topic]))) == {
            config.health_topic: config.partitions}
        run(publish(config, [("steps", e["run_id"].encode(), as_json(e)) for e in after]))

        replay = Replay(keep_final=True)
        for e in before + during + after:
            replay.feed(decode_input(as_json(e)))
        expected = {r: (t.to_state, t.seq) for r, t in replay.final.items()}
        assert len(expected) == 6 * RUNS

        def final(records) -> bool:
            last = {}
            for t in transitions(records):
                last[t["run_id"]] = (t["to_state"], t["seq"])
            return last == expected

        got = transitions(run(read_topic(config, config.health_topic, final, timeout_s=90)))
        seqs: dict[str, list[int]] = {}
        for t in got:
            seqs.setdefault(t["run_id"], []).append(t["seq"])
        for r, (_, last) in expected.items():
            s = seqs[r]
            assert s == list(range(s[0], last + 1)), (r, s)  # in order, each once, no gap, up to replay's last
            if r.startswith("late-"):
                assert s[0] == 1, (r, s)  # started after the topic was back: its whole life is there
        assert wait_for(lambda: worker.get("/readyz")[0] == 200, why=_said(worker))
        assert b"loopwarden_topology_blocked 0.0" in worker.get("/metrics")[1]
        stopping = time.monotonic()
        worker.stop()
        assert time.monotonic() - stopping < config.shutdown_timeout_s + 10
        assert worker.proc.returncode == 0, worker.log_tail()
    finally:
        worker.stop()


@pytest.mark.parametrize("output", ["health_topic", "deadletter_topic"])
def test_a_worker_stopped_while_its_output_topic_has_the_wrong_count_exits_cleanly_in_time(kafka, tmp_path,
                                                                                          output) -> None:
    """An output auto-created with 1 partition under transactions in flight: the worker aborts them, and a
    SIGTERM while it is blocked ends it cleanly (exit 0) within its shutdown timeout, not by its watchdog."""
    config = unique_config(kafka.bootstrap, partitions=4)
    topic = getattr(config, output)
    worker = make_worker(config, tmp_path, "w", topology_check_s=1, shutdown_timeout_s=15).start()
    t0 = int(time.time() * 1000) - 10_000
    try:
        run(publish(config, [("steps", b"first", as_json(started(run="first", ts=t0)))]))
        run(read_topic(config, config.health_topic, lambda recs: len(recs) >= 1))
        runs = [e for i in range(RUNS * 4) for e in (started(run=f"r-{i}", ts=t0), step(0, run=f"r-{i}", ts=t0 + 1))]

        async def delete_while_sending() -> None:
            sending = asyncio.create_task(_send(config, runs))
            await asyncio.sleep(0.5)
            await _admin(config, lambda admin: admin.delete_topics([topic]))
            await _auto_create(config, topic)
            await sending

        run(delete_while_sending())
        wait_for(lambda: f"{topic} has 1 partition".encode() in worker.get("/readyz")[1], why=_said(worker))
        time.sleep(2)
        stopping = time.monotonic()
        worker.stop(timeout_s=30)
        took = time.monotonic() - stopping
        assert worker.proc.returncode == 0, (worker.proc.returncode, worker.log_tail())
        assert took < 15, took
    finally:
        worker.stop()


def test_topics_repair_recreates_an_empty_wrong_count_output_and_refuses_one_holding_records_until_told(kafka, tmp_path) -> None:
    """agent.deadletter auto-created empty with 1 partition and agent.health auto-created with 1 partition holding a
    record, under a running worker: `topics repair --yes` refuses (exit 1, changing nothing) naming the topic, its
    count, the count expected and the command; `--recreate-outputs --yes` recreates both with 4 and the worker, blocked
    until then, recovers by itself and folds new runs."""
    from tests.integration.test_operator_cli import lw

    config = unique_config(kafka.bootstrap, partitions=4)
    worker = make_worker(config, tmp_path, "w", topology_check_s=1).start()
    try:
        t0 = int(time.time() * 1000)
        run(publish(config, [("steps", b"first", as_json(started(run="first", ts=t0)))]))
        run(read_topic(config, config.health_topic, lambda recs: len(recs) >= 1))

        async def auto_create_both() -> None:
            await _admin(config, lambda admin: admin.delete_topics([config.health_topic, config.deadletter_topic]))
            for topic in (config.health_topic, config.deadletter_topic):
                await _auto_create(config, topic)
            async with AIOKafkaProducer(bootstrap_servers=config.broker, acks="all") as producer:
                await producer.send_and_wait(config.health_topic, b"a transition on the auto-created topic", key=b"x")

        run(auto_create_both())
        wait_for(lambda: f"{config.health_topic} has 1 partition".encode() in worker.get("/readyz")[1], why=_said(worker))
        res = lw(config, "topics", "repair", "--yes")
        assert res.returncode == 1, res.stdout
        assert (f"output {config.health_topic} has 1 partition, expected 4, and holds records (1 offsets). A worker "
                "started while it had 4 stays blocked on it.") in res.stderr
        assert "loopwarden topics repair --partitions 4 --recreate-outputs --yes" in res.stderr.strip().splitlines()[-1]
        counts = run(_admin(config, lambda a: existing_counts(a, [config.health_topic, config.deadletter_topic])))
        assert counts == {config.health_topic: 1, config.deadletter_topic: 1}  # refused whole: nothing changed
        assert worker.get("/readyz")[0] == 503

        res = lw(config, "topics", "repair", "--recreate-outputs", "--yes")
        assert res.returncode == 0, res.stderr
        assert f"delete and recreate {config.health_topic} with 4 partitions (it has 1; its 1 offsets of records are deleted)" in res.stdout
        assert f"delete and recreate {config.deadletter_topic} with 4 partitions (it has 1; it holds no records)" in res.stdout
        counts = run(_admin(config, lambda a: existing_counts(a, [config.health_topic, config.deadletter_topic])))
        assert counts == {config.health_topic: 4, config.deadletter_topic: 4}
        assert wait_for(lambda: worker.get("/readyz")[0] == 200, why=_said(worker))
        events = [started(run="after", ts=t0 + 10), step(0, run="after", ts=t0 + 20), ended("natural_finish", 1, run="after", ts=t0 + 30)]
        run(publish(config, [("steps", b"after", as_json(e)) for e in events]))
        got = transitions(run(read_topic(config, config.health_topic, lambda recs: any(
            t["run_id"] == "after" and t["to_state"] == "VERIFYING" for t in transitions(recs)))))
        assert [t["seq"] for t in got if t["run_id"] == "after"] == [1, 2]
    finally:
        worker.stop()


def test_topics_repair_outlasts_a_client_that_auto_creates_the_topic_between_its_delete_and_create(kafka) -> None:
    """A producer refreshing agent.health's metadata every 5 ms (a running worker's does so after an error) makes
    the broker auto-create it with 1 partition the moment it is gone: repair finds it back with the wrong count,
    still empty, deletes and creates it again, and ends with the configured count, saying which it did again.
    (Measured: repair wins the race in 2 attempts of 3 against it, so 10 attempts here; the CLI gives 5.)"""
    config = unique_config(kafka.bootstrap, partitions=4)
    run(repair(config, []))

    async def repair_under_a_fast_client() -> list[str]:
        await delete_topic(config, config.health_topic)
        await _auto_create(config, config.health_topic)
        assert await _admin(config, lambda a: existing_counts(a, [config.health_topic])) == {config.health_topic: 1}
        async with AIOKafkaProducer(bootstrap_servers=config.broker, metadata_max_age_ms=5) as client:
            await client.partitions_for(config.health_topic)
            again = await repair(config, [config.health_topic], attempts=10)
            await asyncio.sleep(0.5)  # the client keeps asking: what it sees now is what stays
            assert len(await client.partitions_for(config.health_topic)) == 4
        return again

    again = run(repair_under_a_fast_client())
    assert set(again) <= {config.health_topic}
    counts = run(_admin(config, lambda a: existing_counts(a, [config.health_topic])))
    assert counts == {config.health_topic: 4}


def test_a_worker_joining_while_an_output_is_broken_stays_blocked_with_the_first_and_both_recover(kafka, tmp_path) -> None:
    """agent.health auto-created with 1 partition under worker A; worker B joins (a rebalance): B is held to the
    group's count (4), so both answer 503 naming it and nothing is folded; once `topics repair` recreates it both
    own partitions again and every run ends as replay says."""
    from tests.integration.test_operator_cli import lw

    config = unique_config(kafka.bootstrap, partitions=4)
    a = make_worker(config, tmp_path, "a", topology_check_s=1).start()
    b = make_worker(config, tmp_path, "b", topology_check_s=1)
    t0 = int(time.time() * 1000) - 10_000
    runs = [f"r-{i}" for i in range(RUNS)]
    first = [e for r in runs for e in (started(run=r, ts=t0), step(0, ("lookup", "result"), run=r, ts=t0 + 100))]
    second = [e for r in runs for e in (step(1, run=r, ts=t0 + 200), ended("natural_finish", 2, run=r, ts=t0 + 300))]
    late = [e for i in range(RUNS) for e in (started(run=f"late-{i}", ts=t0 + 400), step(0, run=f"late-{i}", ts=t0 + 450),
                                            ended("natural_finish", 1, run=f"late-{i}", ts=t0 + 500))]
    try:
        run(publish(config, [("steps", e["run_id"].encode(), as_json(e)) for e in first]))
        run(read_topic(config, config.health_topic, lambda recs: len({t["run_id"] for t in transitions(recs)}) == RUNS))

        async def break_health() -> None:
            await _admin(config, lambda admin: admin.delete_topics([config.health_topic]))
            await _auto_create(config, config.health_topic)

        run(break_health())
        wait_for(lambda: f"{config.health_topic} has 1 partition".encode() in a.get("/readyz")[1], why=_said(a))
        b.start(ready=False)  # joins the group: a rebalance while A is blocked
        status, body = wait_for(lambda: (lambda r: r if b"has 1 partition" in r[1] else None)(b.get("/readyz")), why=_said(b))
        assert status == 503 and config.health_topic in json.loads(body)["layout"], body
        run(publish(config, [("steps", e["run_id"].encode(), as_json(e)) for e in second]))
        time.sleep(4)  # both blocked through the rebalance: nothing folded, nothing produced to the 1-partition topic
        assert a.get("/readyz")[0] == 503 and b.get("/readyz")[0] == 503
        assert run(_admin(config, lambda adm: existing_counts(adm, [config.health_topic]))) == {config.health_topic: 1}
        assert run(records_held(config, config.health_topic, 1)) == 0

        res = lw(config, "topics", "repair", "--yes")  # empty: recreated with 4 without --recreate-outputs
        assert res.returncode == 0, res.stderr
        assert wait_for(lambda: a.get("/readyz")[0] == 200 and b.get("/readyz")[0] == 200, timeout_s=60,
                        why=lambda: _said(a)() + "\n" + _said(b)())
        def owned():
            mine = [json.loads(w.get("/readyz")[1]).get("partitions") or [] for w in (a, b)]
            return mine if sorted(mine[0] + mine[1]) == [0, 1, 2, 3] else None

        assert all(wait_for(owned))  # both own their share again
        run(publish(config, [("steps", e["run_id"].encode(), as_json(e)) for e in late]))

        replay = Replay(keep_final=True)
        for e in first + second + late:
            replay.feed(decode_input(as_json(e)))
        expected = {r: (t.to_state, t.seq) for r, t in replay.final.items()}

        def final(records) -> bool:
            return {t["run_id"]: (t["to_state"], t["seq"]) for t in transitions(records)} == expected

        got = transitions(run(read_topic(config, config.health_topic, final, timeout_s=60)))
        seqs: dict[str, list[int]] = {}
        for t in got:
            seqs.setdefault(t["run_id"], []).append(t["seq"])
        for r, (_, last) in expected.items():
            assert seqs[r] == list(range(seqs[r][0], last + 1)), (r, seqs[r])  # in order, each once, up to replay's
    finally:
        b.stop()
        a.stop()

