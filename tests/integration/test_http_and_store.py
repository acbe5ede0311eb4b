"""The worker's HTTP surface (health, metrics, read API, auth) and the RocksDB store."""

from __future__ import annotations

import asyncio
import json
import signal
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from loopwarden.simulate import fleet
from tests.integration.harness import final_states, make_worker, publish, read_topic, run, tick, unique_config
from tests.integration.test_processor import ADVANCE_MS, replay_final, wait_final

pytestmark = pytest.mark.timeout(300)
TOKEN = "s3cret-token-of-32-characters!!"


def test_http_routes_metrics_and_token(kafka, tmp_path: Path) -> None:
    """/healthz is open; with a token every other route answers 401 without it; metrics and the
    read API carry bounded labels and content-free evidence."""
    config = unique_config(kafka.bootstrap)
    worker = make_worker(config, tmp_path, clock="event", token=TOKEN).start()
    try:
        messages = fleet(40, seed=21, bad_every=0)
        expected, last = replay_final(messages)
        run(publish(worker.config, [(m.topic, m.key, m.value) for m in messages]))
        run(tick(worker.config, last + ADVANCE_MS))
        wait_final(worker.config, expected)

        assert worker.get("/healthz") == (200, b'{"status":"ok"}')
        for path in ("/", "/nope", "/readyz", "/metrics", f"/runs/{next(iter(expected))}", "/runs?state=STUCK"):
            status, body = worker.get(path)
            assert status == 401, path
            assert b"unauthorized" in body
            assert worker.get(path, token="wrong-token-of-enough-length")[0] == 401

        status, body = worker.get("/metrics", TOKEN)
        assert status == 200
        text = body.decode()
        for needle in ("loopwarden_events_total{", "loopwarden_transitions_total{from_state=\"none\",to_state=\"RUNNING\"} 40.0",
                       "loopwarden_runs{state=", "loopwarden_stop_causes_total{cause=", "loopwarden_disagreements_total{kind=",
                       "loopwarden_receipts_total{outcome=\"on_time\"}", "loopwarden_event_to_transition_seconds_bucket",
                       "loopwarden_timers_fired_total{kind=", "loopwarden_transactions_total{result=\"committed\"}"):
            assert needle in text, needle
        assert "run-21-" not in text  # never a run id in a label
        # Every transition is timed once: from its event, or (timer transitions) from its deadline.
        values = {line.split()[0]: float(line.split()[1]) for line in text.splitlines() if line and line[0] != "#"}
        transitions = sum(v for k, v in values.items() if k.startswith("loopwarden_transitions_total{"))
        from_events = values["loopwarden_event_to_transition_seconds_count"]
        from_timers = values["loopwarden_timer_to_transition_seconds_count"]
        assert from_events + from_timers == transitions and from_events >= 40
        assert from_timers == sum(v for k, v in values.items() if k.startswith("loopwarden_timers_fired_total{"))
        assert values["loopwarden_transaction_seconds_count"] == values['loopwarden_transactions_total{result="committed"}']
        # The same transitions by agent: one label per agent of the fleet (bounded, see AGENT_LABELS_MAX).
        by_agent = {k: v for k, v in values.items() if k.startswith("loopwarden_agent_transitions_total{")}
        assert sum(by_agent.values()) == transitions
        agents = {json.loads(m.value)["agent"] for m in messages if b'"run_started"' in m.value}
        # the fleet's no_run_started run has no agent name: "none"
        assert {k.split('agent="')[1].split('"')[0] for k in by_agent} == agents | {"none"}
        assert values["process_resident_memory_bytes"] > 10e6
        lag = [line for line in text.splitlines() if line.startswith("loopwarden_consumer_lag{")]
        assert {'topic="steps"', 'topic="outcomes"'} <= {part for line in lag for part in line[:line.index("}")].split(",")}
        assert all(line.endswith(" 0.0") for line in lag), lag  # everything consumed and committed
        runs_gauge = {line.split('"')[1]: float(line.split()[-1]) for line in text.splitlines()
                      if line.startswith("loopwarden_runs{")}
        assert sum(runs_gauge.values()) == 40
        for state in set(expected.values()):
            assert runs_gauge[state] == list(expected.values()).count(state)

        run_id = next(r for r, s in expected.items() if s == "VERIFIED_COMPLETE")
        status, body = worker.get(f"/runs/{run_id}", TOKEN)
        doc = json.loads(body)
        assert status == 200 and doc["state"] == "VERIFIED_COMPLETE"
        assert set(doc["evidence"]) >= {"reported_cause", "derived_cause", "fired", "step_count", "disagreements",
                                        "receipt_ids", "approval", "tool_errors", "segments", "finish_reason"}
        assert [t["seq"] for t in doc["transitions"]] == list(range(1, doc["seq"] + 1))
        assert worker.get("/runs/no-such-run", TOKEN)[0] == 404
        status, body = worker.get("/runs?state=NOPE", TOKEN)
        assert status == 400 and b"NOPE" in body

        # GET /runs pages through every run the worker holds, each once, with its state.
        seen, path = [], "/runs?limit=7"
        while True:
            status, body = worker.get(path, TOKEN)
            assert status == 200
            page = json.loads(body)
            assert len(page["runs"]) <= 7
            seen += page["runs"]
            if page["next_cursor"] is None:
                break
            path = f"/runs?limit=7&cursor={page['next_cursor']}"
        assert {r["run_id"]: r["state"] for r in seen} == expected and len(seen) == len(expected)
        stuck = json.loads(worker.get("/runs?state=VERIFIED_COMPLETE&limit=10000", TOKEN)[1])["runs"]
        assert sorted(r["run_id"] for r in stuck) == sorted(r for r, s in expected.items() if s == "VERIFIED_COMPLETE")
        # For people and scripts: since when (ms and ISO-8601), how long, why; by agent; oldest first.
        status, body = worker.get(f"/runs/{run_id}", TOKEN)
        doc = json.loads(body)
        assert doc["transitions"][0]["from_state"] is None
        assert [t["from_state"] for t in doc["transitions"][1:]] == [t["to_state"] for t in doc["transitions"][:-1]]
        assert doc["since_ts"] == doc["transitions"][-1]["ts"] and doc["reason"] == doc["transitions"][-1]["reason"]
        assert doc["since"].endswith("Z") and doc["transitions"][-1]["ts_iso"] == doc["since"]
        agent = next(r["agent"] for r in seen if r["agent"])
        mine = json.loads(worker.get(f"/runs?agent={agent}&limit=10000", TOKEN)[1])["runs"]
        assert sorted(r["run_id"] for r in mine) == sorted(r["run_id"] for r in seen if r["agent"] == agent)
        oldest, path = [], "/runs?order=age&limit=6"
        while path:
            page = json.loads(worker.get(path, TOKEN)[1])
            oldest += page["runs"]
            path = page["next_cursor"] and f"/runs?order=age&limit=6&cursor={page['next_cursor']}"
        assert [(r["since_ts"], r["run_id"]) for r in oldest] == sorted((r["since_ts"], r["run_id"]) for r in seen)
        assert all(r["in_state_s"] >= 0 and r["reason"] and r["since"] for r in oldest)
        assert all(r["state_doc"] == "docs/states.md#" + r["state"].lower() for r in oldest)
        assert doc["state_doc"] == "docs/states.md#verified_complete"
        for bad, named in (("/runs?limit=0", b"limit='0'"), ("/runs?limit=ten", b"limit='ten'"),
                           ("/runs?order=newest", b"order='newest'"),
                           ("/runs?cursor=bm9wZQ", b"cursor='bm9wZQ'")):
            status, body = worker.get(bad, TOKEN)
            assert status == 400 and named in body, (bad, body)
    finally:
        worker.stop()


def test_rocksdb_store_survives_a_restart(kafka, tmp_path: Path) -> None:
    """With the RocksDB store, a restarted worker keeps its runs and finishes them."""
    config = unique_config(kafka.bootstrap, store="rocksdb")
    first = make_worker(config, tmp_path, "a", clock="event", store="rocksdb").start()
    messages = fleet(300, seed=13, bad_every=0)
    expected, last = replay_final(messages)
    half = len(messages) // 2
    try:
        run(publish(first.config, [(m.topic, m.key, m.value) for m in messages[:half]]))
        run(read_topic(first.config, first.config.health_topic, lambda r: len(r) > 150, 60))
        assert any(Path(first.config.data_dir).rglob("*.sst")) or any(Path(first.config.data_dir).rglob("CURRENT"))
    finally:
        first.stop(signal.SIGTERM)
    # same data dir: RocksDB state is reused, the changelog fills in the rest
    second = first.__class__(first.config, tmp_path / "b.log").start()
    try:
        run(publish(second.config, [(m.topic, m.key, m.value) for m in messages[half:]]))
        run(tick(second.config, last + ADVANCE_MS))
        assert final_states(wait_final(second.config, expected, timeout_s=120)) == expected
    finally:
        second.stop()


def test_python_publisher_with_msgpack(kafka, tmp_path: Path) -> None:
    """Events sent by loopwarden.publisher as MessagePack (content-type header) are classified."""
    from loopwarden.codecs import MSGPACK, decode_input
    from loopwarden.publisher import Publisher
    from loopwarden.stages.topics import ensure_topics

    config = unique_config(kafka.bootstrap)
    worker = make_worker(config, tmp_path, clock="event").start()
    try:
        messages = [m for m in fleet(30, seed=4, bad_every=0)]
        expected, last = replay_final(messages)

        async def send() -> None:
            await ensure_topics(worker.config)
            async with Publisher(kafka.bootstrap, config.steps_topic, config.outcomes_topic, content_type=MSGPACK) as pub:
                for m in messages:
                    await pub.publish(decode_input(m.value))

        run(send())
        run(tick(worker.config, last + ADVANCE_MS))
        assert final_states(wait_final(worker.config, expected)) == expected
        status, body = worker.get("/metrics")
        assert b'loopwarden_invalid_events_total{reason="undecodable",topic="steps"} 0.0' in body
    finally:
        worker.stop()


class RogueMember(threading.Thread):
    """A process that joins the worker's consumer group (it needs no token for that), advertises its
    own URL for the partitions it gets, records what forwarded reads bring it, and answers forged runs."""

    def __init__(self, config, port: int) -> None:
        super().__init__(daemon=True)
        self.config, self.port = config, port
        self.url = f"http://127.0.0.1:{port}"
        self.requests: list[dict] = []
        self.assigned: set[int] = set()
        self.stopping = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.error = exc

    async def _main(self) -> None:
        from aiohttp import web
        from aiokafka import AIOKafkaConsumer

        from loopwarden.engine.assignment import CoPartitionedAssignor
        from loopwarden.api.http import ANSWER_SIGNATURE

        async def forged(request):
            self.requests.append({"path": request.path_qs, "headers": dict(request.headers)})
            return web.json_response({"run_id": request.match_info["tail"], "state": "VERIFIED_COMPLETE", "forged": True},
                                     headers={ANSWER_SIGNATURE: "0" * 64})

        app = web.Application()
        app.router.add_get("/{tail:.*}", forged)
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", self.port).start()
        c = self.config
        consumer = AIOKafkaConsumer(bootstrap_servers=c.bootstrap, group_id=c.app_id, enable_auto_commit=False,
                                    partition_assignment_strategy=(CoPartitionedAssignor(self.url),),
                                    session_timeout_ms=int(c.session_timeout_s * 1000), heartbeat_interval_ms=1000)
        consumer.subscribe([c.steps_topic, c.outcomes_topic, c.ticks_topic])
        await consumer.start()
        try:
            while not self.stopping.is_set():
                await consumer.getmany(timeout_ms=200)
                self.assigned = {tp.partition for tp in consumer.assignment()}
        finally:
            await consumer.stop()
            await runner.cleanup()


def test_a_rogue_group_member_never_gets_the_token_and_cannot_forge_a_run(kafka, tmp_path: Path) -> None:
    """A member that claims a partition never receives the caller's Bearer token with a forwarded read, and
    its unsigned (forged) answer is a 502, never a 200."""
    from dev.localkafka import free_port
    from loopwarden.engine.assignment import partition_of

    config = unique_config(kafka.bootstrap, partitions=4)
    worker = make_worker(config, tmp_path, clock="event", token=TOKEN).start()
    rogue = RogueMember(worker.config, free_port())
    rogue.start()
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            status, body = worker.get("/readyz", TOKEN)
            if status == 200 and rogue.assigned and len(json.loads(body)["partitions"]) < 4:
                break
            time.sleep(0.2)
        assert rogue.error is None, rogue.error
        assert rogue.assigned, "the rogue member got no partition"
        runs = [f"run-{i}" for i in range(400)]
        theirs = [r for r in runs if partition_of(r.encode(), 4) in rogue.assigned][:30]
        answers = [worker.get(f"/runs/{r}", TOKEN) for r in theirs]
        assert rogue.requests, "nothing was forwarded to the rogue member"
        print(f"\nrogue member: {len(theirs)} reads of its partitions, {len(rogue.requests)} forwarded to it, "
              f"{sum(s == 200 for s, _ in answers)} forged answers passed on")
        for seen in rogue.requests:
            assert "Authorization" not in seen["headers"]
            assert not any(TOKEN in v for v in seen["headers"].values())
        assert all(status == 502 and b"could not be verified" in body for status, body in answers), answers[:3]
        # What the rogue captured opens nothing else: the signature covers the path it was made for.
        captured = rogue.requests[0]["headers"]
        mine = next(r for r in runs if partition_of(r.encode(), 4) not in rogue.assigned)
        req = urllib.request.Request(worker.url + f"/runs/{mine}",
                                     headers={k: v for k, v in captured.items() if k.lower().startswith("x-loopwarden")})
        try:
            urllib.request.urlopen(req, timeout=5)
            raise AssertionError("a replayed signature was accepted for another path")
        except urllib.error.HTTPError as exc:
            assert exc.code == 401
    finally:
        rogue.stopping.set()
        rogue.join(30)
        worker.stop()
