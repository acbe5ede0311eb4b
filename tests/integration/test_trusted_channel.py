"""Receipts trusted by channel on a broker that enforces ACLs (docs/receipts.md): only the verifier's principal
may write the verified topic; the agent's write there is refused by the broker, its forged receipts on the
outcomes topic change nothing, the verifier's receipts decide exactly as the destination says, and the
worker's transitions equal replay's. On a cluster without an authorizer the worker refuses the setting."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import subprocess
import sys
import time
import uuid
from collections import Counter
from dataclasses import replace
from pathlib import Path

import msgspec
import pytest
from aiokafka import AIOKafkaConsumer
from aiokafka.errors import TopicAuthorizationFailedError

from dev.destinations import free_port
from loopwarden.codecs import OutcomeReceipt, decode_input, encode
from loopwarden.publisher import Publisher
from loopwarden.replay import Replay
from loopwarden.config import Config
from loopwarden.engine.security import client_options
from loopwarden.trust import SigningKey, TrustedVerifiers
from tests.integration.acl_broker import (
    GROUP, LITERAL, MECHANISM, PREFIXED, READ, TOPIC, USERS, WRITE, start_acl_broker,
)
from tests.integration.harness import (
    env_for, final_states, make_worker, read_topic, run, stop_process, transitions, unique_config,
)

pytestmark = pytest.mark.timeout(240)
STATES = ("right", "wrong", "missing")


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    b = start_acl_broker(tmp_path_factory.mktemp("acl-kafka"))
    yield b
    b.kafka.stop()


def as_user(config: Config, broker, user: str) -> Config:
    return replace(config, broker=broker.sasl, security_protocol="SASL_PLAINTEXT", sasl_mechanism=MECHANISM,
                   sasl_username=user, sasl_password=USERS[user])


async def _read_input(config: Config, topics: list[str]) -> list:
    """Every record of the input topics, through the super user's listener."""
    consumer = AIOKafkaConsumer(*topics, bootstrap_servers=config.broker, auto_offset_reset="earliest",
                                enable_auto_commit=False, group_id=None)
    await consumer.start()
    records: list = []
    try:
        idle = 0
        while idle < 4:
            batch = await consumer.getmany(timeout_ms=500)
            idle = 0 if batch else idle + 1
            for recs in batch.values():
                records += recs
    finally:
        await consumer.stop()
    return records


def test_only_the_verifiers_channel_decides_and_the_worker_agrees_with_replay(broker, tmp_path: Path) -> None:
    """9 runs (right, wrong, missing file) + 1 decided by a person's signed receipt; the agent's forgeries count for nothing."""
    plain = unique_config(broker.plain, partitions=2)
    verified = f"verified-{plain.app_id}"
    group = f"verify-{plain.app_id}"
    broker.create_acls([
        (TOPIC, verified, LITERAL, "User:verifier", WRITE),
        (TOPIC, plain.steps_topic, LITERAL, "User:verifier", READ),
        (GROUP, "verify-", PREFIXED, "User:verifier", READ),
        (TOPIC, plain.steps_topic, LITERAL, "User:agent", WRITE),
        (TOPIC, plain.outcomes_topic, LITERAL, "User:agent", WRITE),
    ])
    out = tmp_path / "out"
    out.mkdir()
    dest_key, human = SigningKey.generate("verifier-1"), SigningKey.generate("human-1")
    dest_key.save(tmp_path / "verifier.key")
    (tmp_path / "verify.toml").write_text(f"""
broker = "{broker.sasl}"
steps_topic = "{plain.steps_topic}"
outcomes_topic = "{plain.outcomes_topic}"
group_id = "{group}"
signing_key = "{tmp_path / 'verifier.key'}"
check_timeout_s = 3
retry_negative_s = 1
retry_initial_s = 0.2
web_port = {free_port()}
[file]
prefixes = ["{out}"]
""")
    worker = make_worker(as_user(plain, broker, "admin"), tmp_path)
    worker.extra_env = {"LOOPWARDEN_TRUSTED_OUTCOMES_TOPIC": verified, "LOOPWARDEN_TRUSTED_VERIFIERS": human.setting}
    agent = as_user(plain, broker, "agent")
    verifier = None
    try:
        worker.start()  # checks the authorizer, creates the topics (the verified one too)
        assert "trusted receipts topic " + verified + ": authorizer org.apache.kafka.metadata.authorizer." \
               "StandardAuthorizer" in worker.log_tail(200)

        async def agent_writes_the_verified_topic() -> None:
            async with Publisher(agent.broker, options=client_options(agent)) as pub:
                claim = OutcomeReceipt(run_id="x", ts=1, receipt_id="e", kind="file", verifier="destination",
                                       verified=True)
                await pub.publish_raw(verified, b"x", encode(claim), wait=True)

        with pytest.raises(TopicAuthorizationFailedError):
            run(asyncio.wait_for(agent_writes_the_verified_topic(), 60))

        env = {k: v for k, v in os.environ.items() if not k.startswith("LOOPWARDEN_")}
        env.update({"LOOPWARDEN_SECURITY_PROTOCOL": "SASL_PLAINTEXT", "LOOPWARDEN_SASL_MECHANISM": MECHANISM,
                    "LOOPWARDEN_SASL_USERNAME": "verifier", "LOOPWARDEN_SASL_PASSWORD": USERS["verifier"],
                    "LOOPWARDEN_TRUSTED_OUTCOMES_TOPIC": verified})
        verifier = subprocess.Popen([sys.executable, "-m", "loopwarden.cli", "verify", "--config",
                                     str(tmp_path / "verify.toml")], env=env,
                                    stdout=open(tmp_path / "verify.log", "wb"), stderr=subprocess.STDOUT)
        expected: dict[str, str] = {}
        events: list = []
        forged = 0
        now = int(time.time() * 1000)
        for i in range(9):
            state = STATES[i % 3]
            run_id, exp_id = f"acl-{i}-{state}", f"exp-{i}"
            body = f"report {i}\n".encode() * 20
            if state != "missing":
                (out / f"{run_id}.txt").write_bytes(body if state == "right" else body[:-1] + b"?")
            expected[run_id] = "VERIFIED_COMPLETE" if state == "right" else "FALSE_COMPLETE"
            ts = now + 10 * i
            events += [
                {"type": "run_started", "run_id": run_id, "ts": ts, "agent": "acl",
                 "policy": {"version": "v1", "receipt_window_s": 60, "required_outcomes": ["file"]}},
                {"type": "outcome_expected", "run_id": run_id, "ts": ts, "expectation_id": exp_id, "kind": "file",
                 "target": f"file://{out}/{run_id}.txt",
                 "checks": {"min_size": 100, "sha256": hashlib.sha256(body).hexdigest()}},
                {"type": "step_finished", "run_id": run_id, "ts": ts + 1, "step": 0, "finish_reason": "stop"},
                {"type": "run_ended", "run_id": run_id, "ts": ts + 2, "cause": "natural_finish", "step_count": 1,
                 "approval": None, "error_name": None},
            ]
            if state != "right":  # the agent says it is done itself: valid JSON, on the topic it may write
                events.append({"type": "outcome_receipt", "run_id": run_id, "ts": ts + 3, "receipt_id": exp_id,
                               "kind": "file", "verifier": "destination", "verified": True, "evidence": {"size": 1}})
                forged += 1
        # A person's decision, signed with a trusted key, may travel the outcomes topic (the agent's producer).
        # Stamped after every other run's events, so the worker's stream-time alignment orders its receipt
        # after its run_ended whatever the fetches: replay below applies the lines in ts order. (A receipt
        # stamped behind the steps' stream time is applied as it arrives, and may overtake its run_ended.)
        human_run, human_ts = "acl-human", now + 100
        expected[human_run] = "VERIFIED_COMPLETE"
        events += [
            {"type": "run_started", "run_id": human_run, "ts": human_ts, "agent": "acl",
             "policy": {"version": "v1", "receipt_window_s": 60, "required_outcomes": ["other"]}},
            {"type": "step_finished", "run_id": human_run, "ts": human_ts + 1, "step": 0, "finish_reason": "stop"},
            {"type": "run_ended", "run_id": human_run, "ts": human_ts + 1, "cause": "natural_finish",
             "step_count": 1, "approval": None, "error_name": None},
            json.loads(encode(human.sign(OutcomeReceipt(run_id=human_run, ts=human_ts + 2, receipt_id="human:other",
                                                        kind="other", verifier="human", verified=True)))),
        ]

        async def agent_publishes() -> None:
            async with Publisher(agent.broker, agent.steps_topic, agent.outcomes_topic,
                                 options=client_options(agent)) as pub:
                for e in events:
                    await pub.publish(decode_input(json.dumps(e).encode()))

        run(agent_publishes())

        def done(records):
            return final_states(transitions(records)) == expected

        got = transitions(run(read_topic(plain, plain.health_topic, done, timeout_s=120)))
        assert final_states(got) == expected, (verifier.poll(), (tmp_path / "verify.log").read_text()[-3000:])
        last = {t["run_id"]: t for t in got}
        for i in range(9):
            ev = last[f"acl-{i}-{STATES[i % 3]}"]["evidence"]
            assert ev["receipt_trust"] == {f"exp-{i}": "channel:" + verified}, ev
            assert ev.get("untrusted_receipt_ids", []) == ([] if i % 3 == 0 else [f"exp-{i}"])
        assert last[human_run]["evidence"]["receipt_trust"] == {"human:other": "key:human-1"}
        metrics = worker.get("/metrics")[1].decode()
        assert f'loopwarden_receipts_total{{outcome="untrusted_unsigned"}} {float(forged)}' in metrics

        # replay of the same three topics (the verified one's receipts fed as on the channel): the same transitions
        records = run(_read_input(plain, [plain.steps_topic, plain.outcomes_topic, verified]))
        replay = Replay(verifiers=TrustedVerifiers.parse(human.setting), channel=verified)
        replayed = []
        for rec in sorted(records, key=lambda r: (decode_input(r.value).ts, r.topic != plain.steps_topic)):
            replayed += replay.feed(decode_input(rec.value), on_channel=rec.topic == verified)
        worker_ts = sorted((t["run_id"], t["seq"], json.dumps({**t, "emitted_ts": 0}, sort_keys=True)) for t in got)
        replay_ts = sorted((t.run_id, t.seq, json.dumps({**json.loads(encode(t)), "emitted_ts": 0}, sort_keys=True))
                           for t in replayed)
        assert worker_ts == replay_ts
        assert Counter(r.topic for r in records)[verified] == 9  # one signed receipt per expectation, all on the channel
        assert all(msgspec.json.decode(r.value, type=OutcomeReceipt).signature is not msgspec.UNSET
                   for r in records if r.topic == verified)
        assert worker.proc.poll() is None and "Traceback" not in worker.log_tail(300)
        check = subprocess.run([sys.executable, "-m", "loopwarden.cli", "topics", "check"],
                               env={**env_for(worker.config), "LOOPWARDEN_TRUSTED_OUTCOMES_TOPIC": verified},
                               capture_output=True, text=True, timeout=120)
        assert check.returncode == 0, check.stderr
        assert f"  {verified:<32} 2 partitions, ok" in check.stdout
        assert f"trusted receipts topic {verified}: authorizer org.apache.kafka.metadata.authorizer." \
               "StandardAuthorizer;" in check.stdout
        print(f"\nruns per final state: {dict(Counter(final_states(got).values()))}; forged refused: {forged}")
    finally:
        if verifier is not None:
            stop_process(verifier, timeout_s=15)
        worker.stop()


def test_without_an_authorizer_the_worker_refuses_the_trusted_topic_unless_told(kafka, tmp_path: Path) -> None:
    """The session's broker has no authorizer: worker and `topics check` name the setting; the override lets them."""
    config = unique_config(kafka.bootstrap)
    topic = f"verified-{uuid.uuid4().hex[:8]}"
    env = {**env_for(config), "LOOPWARDEN_TRUSTED_OUTCOMES_TOPIC": topic}
    res = subprocess.run([sys.executable, "-m", "loopwarden.cli", "worker", "--web-port", str(free_port())],
                         env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 1
    assert res.stderr.strip().splitlines()[-1].startswith(
        f"loopwarden worker: LOOPWARDEN_TRUSTED_OUTCOMES_TOPIC={topic}: the cluster has no authorizer"), res.stderr
    assert "LOOPWARDEN_TRUSTED_OUTCOMES_WITHOUT_ACL=1" in res.stderr
    check = subprocess.run([sys.executable, "-m", "loopwarden.cli", "topics", "check"], env=env,
                           capture_output=True, text=True, timeout=120)
    assert check.returncode == 1 and "the cluster has no authorizer" in check.stderr
    assert f"  {topic:<32} missing" in check.stdout  # in the layout, and nothing was created by the refusal
    told = subprocess.run([sys.executable, "-m", "loopwarden.cli", "topics", "check"],
                          env={**env, "LOOPWARDEN_TRUSTED_OUTCOMES_WITHOUT_ACL": "1"},
                          capture_output=True, text=True, timeout=120)
    assert told.returncode == 0, told.stderr
    assert "accepted without ACLs (LOOPWARDEN_TRUSTED_OUTCOMES_WITHOUT_ACL=1)" in told.stdout
