"""End to end: a fleet declares outcomes; `loopwarden verify` checks real destinations and signs;
the worker, trusting only the verifier's key, calls runs complete exactly where the destination says so.

Real parts only: the local Kafka broker, a `loopwarden worker` and a `loopwarden verify` subprocess,
files on disk, an HTTPS server with a test CA, Debian's PostgreSQL. The agent side also publishes
forged receipts (valid JSON, no signature, a copied signature, an unknown key): they change nothing.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from loopwarden.codecs import OutcomeReceipt, encode
from loopwarden.trust import SigningKey
from dev.destinations import PostgresCluster, free_port, make_ca_and_server_cert, start_https
from tests.integration.harness import (
    events_consumed, final_states, make_worker, publish, read_topic, run, stop_process, transitions, unique_config,
)

pytestmark = pytest.mark.timeout(300)
KINDS = ("file", "http", "postgresql", "json_schema")
STATES = ("right", "wrong", "missing")
RECEIPT_KIND = {"file": "file", "http": "deployment", "postgresql": "record", "json_schema": "analysis"}
SCHEMA = {"type": "object", "required": ["summary", "sections"],
          "properties": {"sections": {"type": "array", "minItems": 2}}}


class HttpsInThread(threading.Thread):
    """The HTTPS destination in its own event loop: /deploy/<run>.json answers a version, or 404."""

    def __init__(self, tmp: Path, versions: dict[str, str]) -> None:
        super().__init__(daemon=True)
        self.ca, self.cert, self.key = make_ca_and_server_cert(tmp)
        self.versions = versions
        self.ready = threading.Event()
        self.loop = asyncio.new_event_loop()

    def run(self) -> None:
        asyncio.set_event_loop(self.loop)

        async def deploy(request):
            version = self.versions.get(request.match_info["run"])
            if version is None:
                raise web.HTTPNotFound()
            return web.json_response({"version": version})

        self.runner, self.port = self.loop.run_until_complete(
            start_https([web.get("/deploy/{run}.json", deploy)], self.cert, self.key))
        self.ready.set()
        self.loop.run_forever()

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)


def _metric(url: str, name: str) -> dict[tuple, float]:
    import urllib.request

    with urllib.request.urlopen(url + "/metrics", timeout=5) as resp:
        text = resp.read().decode()
    return {tuple(sorted(s.labels.items())): s.value for f in text_string_to_metric_families(text)
            for s in f.samples if s.name == name}


def test_fleet_ends_verified_or_false_complete_exactly_where_the_destination_says(kafka, tmp_path: Path) -> None:
    """24 runs × (file, https, postgresql, json_schema) × (right, wrong, missing); forged receipts refused."""
    out = tmp_path / "out"
    out.mkdir()
    versions: dict[str, str] = {}
    https = HttpsInThread(tmp_path, versions)
    pg = PostgresCluster(tls=(https.cert, https.key)).start()  # the test CA signed both servers' certificates
    pg.psql("CREATE TABLE invoices (run_id text PRIMARY KEY, status text)")
    https.start()
    https.ready.wait(30)
    config = unique_config(kafka.bootstrap, partitions=2)
    key = SigningKey.generate("verifier-e2e")
    key_path = tmp_path / "verifier.key"
    key.save(key_path)
    (tmp_path / "report.schema.json").write_text(json.dumps(SCHEMA))
    verify_port = free_port()
    (tmp_path / "verify.toml").write_text(f"""
broker = "{kafka.bootstrap}"
steps_topic = "{config.steps_topic}"
outcomes_topic = "{config.outcomes_topic}"
group_id = "verify-{config.app_id}"
signing_key = "{key_path}"
check_timeout_s = 3
retry_negative_s = 1
retry_initial_s = 0.2
web_port = {verify_port}
[file]
prefixes = ["{out}"]
[http]
hosts = ["localhost:{https.port}"]
cafile = "{https.ca}"
[[postgresql.databases]]
host = "127.0.0.1"
port = {pg.port}
dbname = "postgres"
user = "{pg.user}"
password_env = "E2E_PG_PASSWORD"
tables = ["invoices"]
sslrootcert = "{https.ca}"
[json_schemas]
report-v1 = "{tmp_path / 'report.schema.json'}"
""")
    worker = make_worker(config, tmp_path)
    worker.extra_env = {"LOOPWARDEN_TRUSTED_VERIFIERS": key.setting}
    verifier = None
    try:
        worker.start()  # creates the topics with their partition counts
        verifier = subprocess.Popen(
            [sys.executable, "-m", "loopwarden.cli", "verify", "--config", str(tmp_path / "verify.toml")],
            env={**os.environ, "E2E_PG_PASSWORD": pg.password},
            stdout=open(tmp_path / "verify.log", "wb"), stderr=subprocess.STDOUT)
        expected: dict[str, str] = {}
        messages: list[tuple] = []
        forged = Counter()
        now = int(time.time() * 1000)
        for i in range(24):
            checker, state = KINDS[i % 4], STATES[(i // 4) % 3]
            run_id, exp_id = f"e2e-{i:02d}-{checker}-{state}", f"exp-{i:02d}"
            kind = RECEIPT_KIND[checker]
            good = state == "right"
            expected[run_id] = "VERIFIED_COMPLETE" if good else "FALSE_COMPLETE"
            if checker == "file":
                body = f"invoice {i}\n".encode() * 50
                target, checks = f"file://{out}/{run_id}.txt", {"min_size": 100, "sha256": hashlib.sha256(body).hexdigest()}
                if state != "missing":
                    (out / f"{run_id}.txt").write_bytes(body if good else body[:-1] + b"?")
            elif checker == "http":
                target, checks = f"https://localhost:{https.port}/deploy/{run_id}.json", {"json": {"/version": f"v{i}"}}
                if state != "missing":
                    versions[run_id] = f"v{i}" if good else f"v{i - 1}"
            elif checker == "postgresql":
                target = f"postgresql://127.0.0.1:{pg.port}/postgres#invoices"
                checks = {"row": {"run_id": run_id}, "fields": {"status": "sent"}}
                if state != "missing":
                    pg.psql(f"INSERT INTO invoices VALUES ('{run_id}', '{'sent' if good else 'draft'}')")
            else:
                target, checks = f"file://{out}/{run_id}.json", {"json_schema": "report-v1"}
                if state != "missing":
                    doc = {"summary": "s", "sections": [1, 2] if good else [1]}
                    (out / f"{run_id}.json").write_text(json.dumps(doc))
            ts = now + i
            steps = [
                {"type": "run_started", "run_id": run_id, "ts": ts, "agent": "e2e",
                 "policy": {"version": "v1", "receipt_window_s": 60, "required_outcomes": [kind]}},
                {"type": "outcome_expected", "run_id": run_id, "ts": ts, "expectation_id": exp_id, "kind": kind,
                 "target": target, "checks": checks},
                {"type": "step_finished", "run_id": run_id, "ts": ts + 1, "step": 0, "finish_reason": "stop"},
            ]
            messages += [("steps", run_id.encode(), json.dumps(e).encode()) for e in steps]
            if not good:  # the agent claims success itself: valid JSON, never signed by a trusted key
                claim = OutcomeReceipt(run_id=run_id, ts=ts + 1, receipt_id=exp_id, kind=kind, verifier="destination",
                                       verified=True, evidence={"size": 999})
                way = i % 3
                if way == 0:
                    messages.append(("outcomes", run_id.encode(), encode(claim)))
                    forged["unsigned"] += 1
                elif way == 1:  # a signature copied from another receipt of the trusted key
                    other = key.sign(OutcomeReceipt(run_id="elsewhere", ts=1, receipt_id="x", kind=kind,
                                                    verifier="destination", verified=True))
                    messages.append(("outcomes", run_id.encode(), encode(OutcomeReceipt(
                        **{**{f: getattr(claim, f) for f in claim.__struct_fields__}, "signature": other.signature}))))
                    forged["bad_signature"] += 1
                else:  # signed, by a key nobody trusts
                    messages.append(("outcomes", run_id.encode(), encode(SigningKey.generate("agent").sign(claim))))
                    forged["unknown_key"] += 1
            messages.append(("steps", run_id.encode(), json.dumps(
                {"type": "run_ended", "run_id": run_id, "ts": ts + 2, "cause": "natural_finish", "step_count": 1,
                 "approval": None, "error_name": None}).encode()))
        run(publish(worker.config, messages))

        def done(records):
            return final_states(transitions(records)) == expected

        got = final_states(transitions(run(read_topic(worker.config, worker.config.health_topic, done, timeout_s=120))))
        assert got == expected, (Counter(got.values()), verifier.poll(), (tmp_path / "verify.log").read_text()[-3000:])
        assert events_consumed(worker) == len(messages) + len(expected)  # and one signed receipt per expectation
        receipts = _metric(worker.url, "loopwarden_receipts_total")
        untrusted = {dict(k)["outcome"].removeprefix("untrusted_"): v for k, v in receipts.items()
                     if dict(k)["outcome"].startswith("untrusted_") and v}
        assert untrusted == dict(forged), untrusted
        checks = _metric(f"http://127.0.0.1:{verify_port}", "loopwarden_verify_checks_total")
        final = {(dict(k)["checker"], dict(k)["outcome"]): v for k, v in checks.items()
                 if dict(k)["outcome"] in ("verified", "rejected") and v}
        assert final == {(c, o): 2 * (1 if o == "verified" else 2) for c in KINDS for o in ("verified", "rejected")}
        print(f"\nruns per final state: {dict(Counter(got.values()))}; forged receipts refused: {dict(forged)}; "
              f"checks (final answers) per checker: {final}")
    finally:
        if verifier is not None:
            stop_process(verifier, timeout_s=15)
        worker.stop()
        https.stop()
        pg.stop()


async def _rewound_and_read(bootstrap: str) -> tuple[int, int]:
    """An empty two-partition topic, 40 records published while ``seek_since`` positions a consumer on it (as the
    verifier's assignment does when agents publish meanwhile); (records published, records the consumer read)."""
    import uuid

    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    from loopwarden.engine.recovery import seek_since

    topic = f"rewind-{uuid.uuid4().hex[:8]}"
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    await admin.create_topics([NewTopic(topic, 2, 1)])
    await admin.close()
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=True)
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,
                                isolation_level="read_committed")
    await producer.start()
    await consumer.start()
    try:
        tps = [TopicPartition(topic, 0), TopicPartition(topic, 1)]
        consumer.assign(tps)

        async def publishing() -> None:
            for i in range(40):
                await producer.send(topic, b"x", key=b"%d" % i, partition=i % 2)
                await asyncio.sleep(0)
            await producer.flush()

        sending = asyncio.create_task(publishing())
        await seek_since(consumer, tps, int(time.time() * 1000) - 3_600_000)
        await sending
        read, deadline = 0, time.monotonic() + 5
        while read < 40 and time.monotonic() < deadline:
            read += sum(map(len, (await consumer.getmany(timeout_ms=200)).values()))
        return 40, read
    finally:
        await consumer.stop()
        await producer.stop()


def test_the_verifier_reads_every_record_published_while_its_partitions_are_assigned(kafka) -> None:
    """Rewinding on assignment takes explicit offsets: records published meanwhile are all read, in every try
    (``offsets_for_times`` then ``seek_to_end`` can lose records published between the two: runs FALSE_COMPLETE,
    their expectations never checked)."""
    for _ in range(12):
        published, read = asyncio.run(_rewound_and_read(kafka.bootstrap))
        assert read == published
