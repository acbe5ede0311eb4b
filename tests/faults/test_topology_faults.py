"""Topology while the worker runs: partitions added out of band, the product's own expansion, misrouted records.

Each reads agent.health ``read_committed``: nothing may be folded on a layout that broke
co-partitioning, and after ``loopwarden topics expand`` no run may be lost or end in another
state than offline replay gives on the same events.
"""

from __future__ import annotations

import json
import signal
import time

import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewPartitions

from loopwarden.codecs import decode_input
from loopwarden.replay import Replay
from loopwarden.engine.assignment import partition_of
from loopwarden.stages.health.expand import expand
from tests.builders import ended, receipt, started, step
from tests.faults.test_worker_faults import assert_exactly_once
from tests.integration.harness import (
    as_json,
    make_worker,
    publish,
    read_topic,
    run,
    transitions,
    unique_config,
    wait_for,
)

pytestmark = pytest.mark.timeout(400)

RUNS = 60


def test_partitions_added_out_of_band_stop_folding_and_the_products_expansion_loses_no_run(kafka, tmp_path) -> None:
    """steps grown 4 -> 6 behind the worker's back: /readyz 503 naming it within a check interval, nothing folded;
    `topics expand` to 6 and a restart: every run, in flight across both, ends as replay says, each seq once."""
    config = unique_config(kafka.bootstrap, partitions=4)
    worker = make_worker(config, tmp_path, "w", topology_check_s=1).start()
    t0 = int(time.time() * 1000) - 10_000
    runs = [f"topo-{i}" for i in range(RUNS)]
    first = [e for r in runs for e in (started(run=r, ts=t0), step(0, ("lookup", "result"), run=r, ts=t0 + 100))]
    run(publish(config, [("steps", e["run_id"].encode(), as_json(e)) for e in first]))

    def running(records) -> bool:
        return len({t["run_id"] for t in transitions(records)}) == RUNS

    before = transitions(run(read_topic(config, config.health_topic, running)))

    async def grow_steps() -> None:
        admin = AIOKafkaAdminClient(bootstrap_servers=config.broker)
        await admin.start()
        try:
            await admin.create_partitions({config.steps_topic: NewPartitions(6)})
        finally:
            await admin.close()

    grown_at = time.monotonic()
    run(grow_steps())
    status, body = wait_for(lambda: (lambda r: r if r[0] == 503 else None)(worker.get("/readyz")))
    detected_s = time.monotonic() - grown_at
    assert config.steps_topic in json.loads(body)["layout"]
    assert detected_s < 10, detected_s
    assert b"loopwarden_topology_blocked 1.0" in worker.get("/metrics")[1]

    # Producers now hash steps over 6 partitions (and receipts still over 4): nothing of it may be folded.
    second = [e for r in runs for e in (step(1, run=r, ts=t0 + 200), ended("natural_finish", 2, run=r, ts=t0 + 300))]

    async def send_fresh() -> None:  # a producer that learned the new layout (the default partitioner, over 6)
        async with AIOKafkaProducer(bootstrap_servers=config.broker, acks="all") as producer:
            for e in second:
                await producer.send(config.steps_topic, as_json(e), key=e["run_id"].encode())

    run(send_fresh())
    time.sleep(3)
    held = transitions(run(read_topic(config, config.health_topic, lambda recs: len(recs) >= len(before),
                                      timeout_s=10)))
    assert len(held) == len(before), "a transition was folded on the broken layout"
    joiner = make_worker(config, tmp_path, "joiner", topology_check_s=1)  # a worker joining now refuses to start
    try:
        joiner.start(ready=False)
    except RuntimeError as exc:
        assert "exited with 1" in str(exc)
    else:  # it answered /readyz (503) between starting its web server and checking the layout: it exits next
        assert joiner.proc is not None and joiner.proc.wait(timeout=60) == 1
    assert f"if a topic was grown, stop every worker and run `loopwarden topics expand --to 6`" in joiner.log_tail()
    assert worker.get("/readyz")[0] == 503
    worker.stop()

    report = run(expand(config, 6))
    assert report.grown == sorted([config.outcomes_topic, config.ticks_topic, config.changelog_topic])
    assert report.runs_moved == sum(partition_of(r.encode(), 4) != partition_of(r.encode(), 6) for r in runs)
    worker = make_worker(config, tmp_path, "w2", partitions=6, topology_check_s=1).start()
    try:
        replay = Replay(keep_final=True)
        for e in first + second:
            replay.feed(decode_input(as_json(e)))
        expected = {r: t.to_state for r, t in replay.final.items()}
        assert set(expected.values()) == {"VERIFYING"}

        def final(records) -> bool:
            last = {}
            for t in transitions(records):
                last[t["run_id"]] = t["to_state"]
            return last == expected

        assert_exactly_once(transitions(run(read_topic(config, config.health_topic, final, timeout_s=60))), expected)
        assert worker.get("/readyz")[0] == 200
    finally:
        worker.stop()


def test_a_record_on_a_partition_its_key_does_not_hash_to_is_dead_lettered(kafka, tmp_path) -> None:
    """A producer with another partitioner: the record goes to agent.deadletter (wrong_partition), not to a run."""
    config = unique_config(kafka.bootstrap, partitions=4)
    worker = make_worker(config, tmp_path, "w").start()
    try:
        right = partition_of(b"misrouted", 4)
        wrong = (right + 1) % 4
        event = started(run="misrouted", ts=int(time.time() * 1000))

        async def send() -> None:
            async with AIOKafkaProducer(bootstrap_servers=config.broker, acks="all") as producer:
                await producer.send_and_wait(config.steps_topic, as_json(event), key=b"misrouted", partition=wrong)
                ok = started(run="routed", ts=int(time.time() * 1000))
                await producer.send_and_wait(config.steps_topic, as_json(ok), key=b"routed")

        run(send())
        letters = run(read_topic(config, config.deadletter_topic, lambda recs: len(recs) >= 1))
        headers = dict(letters[0].headers)
        assert headers["error_reason"] == b"wrong_partition"
        assert headers["source_partition"] == str(wrong).encode()
        assert f"hashes to partition {right} of {config.steps_topic}".encode() in headers["error"]
        health = transitions(run(read_topic(config, config.health_topic, lambda recs: len(recs) >= 1)))
        assert {t["run_id"] for t in health} == {"routed"}
        assert b'loopwarden_invalid_events_total{reason="wrong_partition",topic="steps"} 1.0' in worker.get("/metrics")[1]
    finally:
        worker.stop()


@pytest.mark.parametrize("kill", [False, True], ids=["steady", "sigkill-while-settling"])
def test_stale_and_fresh_producers_interleaving_a_runs_events_after_an_expansion_end_as_replay(kafka, tmp_path,
                                                                                               kill) -> None:
    """After `topics expand` 4 -> 6, each run's events alternate between a producer still hashing over 4 (forwarded
    by the worker) and one hashing over 6: the forwarded ones arrive after later direct ones, yet every run ends as
    replay of the events in produce order says, each seq once (also with the worker SIGKILLed while records wait)."""
    config = unique_config(kafka.bootstrap, partitions=4)
    worker = make_worker(config, tmp_path, "w", topology_check_s=1).start()
    now = int(time.time() * 1000)
    flying = [f"fly-{i}" for i in range(30)]  # started before the expansion
    fresh_runs = [f"new-{i}" for i in range(30)]  # started after it, by a producer still hashing over 4
    first = [e for r in flying for e in (started(run=r, ts=now), step(0, ("lookup", "result"), run=r, ts=now + 1))]
    run(publish(config, [("steps", e["run_id"].encode(), as_json(e)) for e in first]))
    run(read_topic(config, config.health_topic, lambda recs: len({t["run_id"] for t in transitions(recs)}) == len(flying)))
    worker.stop()
    run(expand(config, 6))
    worker = make_worker(config, tmp_path, "w2", partitions=6, topology_check_s=1).start()
    try:
        t0 = int(time.time() * 1000)
        # (old count's producer?, role, event), in produce order: each run's early events hashed over 4, its later
        # ones over 6, runs interleaved so the direct records of one run reach its partition before its forwarded ones.
        sent: list[tuple[bool, str, dict]] = []
        for i, r in enumerate(flying):
            sent += [(True, "steps", step(1, ("lookup", "result"), run=r, ts=t0 + i)),
                     (False, "steps", step(2, run=r, ts=t0 + i + 1)),
                     (False, "steps", ended("natural_finish", 3, run=r, ts=t0 + i + 2)),
                     (False, "outcomes", receipt(f"rc-{r}", run=r, ts=t0 + i + 3))]
        for i, r in enumerate(fresh_runs):
            sent += [(True, "steps", started(run=r, ts=t0 + i)),
                     (True, "steps", step(0, ("lookup", "result"), run=r, ts=t0 + i + 1)),
                     (False, "steps", step(1, run=r, ts=t0 + i + 2)),
                     (False, "steps", ended("natural_finish", 2, run=r, ts=t0 + i + 3)),
                     (False, "outcomes", receipt(f"rc-{r}", run=r, ts=t0 + i + 4))]

        async def send() -> None:
            topics = {"steps": config.steps_topic, "outcomes": config.outcomes_topic}
            async with AIOKafkaProducer(bootstrap_servers=config.broker, acks="all", linger_ms=0) as producer:
                for stale, role, e in sent:
                    key = e["run_id"].encode()
                    await producer.send_and_wait(topics[role], as_json(e), key=key,
                                                 partition=partition_of(key, 4 if stale else 6))

        run(send())
        if kill:  # records of moved runs wait in the changelog now: a restart must find them there
            time.sleep(0.5)
            worker.stop(signal.SIGKILL)
            worker = make_worker(config, tmp_path, "w3", partitions=6, topology_check_s=1).start()
        replay = Replay(keep_final=True)
        for e in first + [e for _stale, _role, e in sent]:
            replay.feed(decode_input(as_json(e)))
        expected = {r: t.to_state for r, t in replay.final.items()}
        assert set(expected.values()) == {"VERIFIED_COMPLETE"}
        moved = [r for r in flying + fresh_runs if partition_of(r.encode(), 4) != partition_of(r.encode(), 6)]
        assert len(moved) >= 20  # the runs whose records reach their partition both ways

        def final(records) -> bool:  # every run has a verdict (right or wrong: asserted below)
            last = {t["run_id"]: t["to_state"] for t in transitions(records)}
            return all(last.get(r) in ("VERIFIED_COMPLETE", "FALSE_COMPLETE", "UNCERTAIN") for r in expected)

        ts = transitions(run(read_topic(config, config.health_topic, final, timeout_s=60)))
        assert_exactly_once(ts, expected)
        assert b'loopwarden_repartitioned_events_total{how="forwarded"}' in worker.get("/metrics")[1]
    finally:
        worker.stop()
