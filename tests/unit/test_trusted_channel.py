"""Receipts trusted by channel (docs/receipts.md): the verifiers' own topic, its place in the layout and the
stage, the evidence of how each receipt was trusted, and the refusal of a cluster without an authorizer."""

from __future__ import annotations

import json
import zlib
from collections import Counter

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loopwarden.codecs import HealthTransition, decode_input, decode_outcome_event, encode
from loopwarden.replay import Replay
from loopwarden.rules import Settings, decode_state, encode_state
from loopwarden.simulate import fleet
from loopwarden.stages.health.acl import Authorizer, problem
from loopwarden.engine.alignment import ALIGNED, StreamTime
from loopwarden.config import Config, from_env
from loopwarden.engine.exceptions import ConfigError
from loopwarden.stages.health.stage import HealthStage
from loopwarden.engine.metrics import EngineMetrics
from loopwarden.stages.health.metrics import HealthMetrics
from loopwarden.stages.health.task import PartitionTask, Tick, encode_tick
from loopwarden.stages.topics import co_partitioned, plan, wanted
from loopwarden.stages.health.topology import assess
from loopwarden.trust import ReceiptTrust, SigningKey, TrustedVerifiers
from tests.builders import ended, receipt, started, step, timed
from tests.unit.test_task import Rec

VERIFIED = "agent.outcomes.verified"
ROLES = {"agent.steps": "steps", "agent.outcomes": "outcomes", VERIFIED: "verified_outcomes",
         "loopwarden.ticks": "ticks"}
NOW = 1_000_000_000


def _task(trust: ReceiptTrust | None) -> PartitionTask:
    return PartitionTask(0, {}, ROLES, settings=Settings(), clock="event", wall_ms=lambda: NOW + 60_000, trust=trust)


def _steps() -> list[Rec]:
    events = timed(started(), step(0), ended("natural_finish", 1), start=NOW)
    return [Rec("agent.steps", 0, i, b"r", json.dumps(e).encode()) for i, e in enumerate(events)]


def _receipt(rid: str, ts: int, verified: bool = True) -> bytes:
    return json.dumps({**receipt(rid, verified=verified), "ts": ts}).encode()


def test_a_receipt_on_the_verified_topic_counts_unsigned_and_its_evidence_names_the_channel() -> None:
    """The agent's unsigned receipt on agent.outcomes changes nothing; the verifier's on the channel decides."""
    key = SigningKey.generate("dest-1")
    task = _task(ReceiptTrust(TrustedVerifiers.parse(key.setting), VERIFIED))
    forged = Rec("agent.outcomes", 0, 0, b"r", _receipt("exp-1", NOW + 5000))
    first = task.fold(_steps() + [forged])
    assert [t.to_state for t in first.transitions] == ["RUNNING", "VERIFYING"]
    assert first.counts["receipt", "untrusted_unsigned"] == 1
    task.committed(first)
    task.store = {k: v for k, v in first.changes.items() if v is not None}
    second = task.fold([Rec(VERIFIED, 0, 0, b"r", _receipt("exp-1", NOW + 6000))])
    assert [(t.to_state, t.reason) for t in second.transitions] == [("VERIFIED_COMPLETE", "receipt")]
    evidence = second.transitions[0].evidence
    assert evidence.receipt_trust == {"exp-1": "channel:" + VERIFIED}
    assert evidence.untrusted_receipt_ids == ("exp-1",) and evidence.receipt_ids == ("exp-1",)
    assert second.counts["event", "verified_outcomes", "outcome_receipt"] == 1 and second.offsets == {VERIFIED: 1}
    state = decode_state(second.changes[b"r"], "r")
    assert state.receipt_trust == {"exp-1": "channel:" + VERIFIED} and decode_state(encode_state(state), "r") == state


def test_a_negative_receipt_on_the_channel_makes_the_run_false_complete() -> None:
    """verified=false from the verifiers' topic is as decisive as true: FALSE_COMPLETE, trusted by channel."""
    task = _task(ReceiptTrust(None, VERIFIED))
    out = task.fold(_steps() + [Rec(VERIFIED, 0, 0, b"r", _receipt("exp-1", NOW + 5000, verified=False))])
    assert [(t.to_state, t.reason) for t in out.transitions][-1] == ("FALSE_COMPLETE", "negative_receipt")
    assert out.transitions[-1].evidence.receipt_trust == {"exp-1": "channel:" + VERIFIED}


def test_with_the_channel_and_no_trusted_key_no_receipt_on_the_outcomes_topic_counts() -> None:
    """Signed or not, a receipt on agent.outcomes is untrusted when the channel is the only way in."""
    key = SigningKey.generate("dest-1")
    signed = key.sign(decode_outcome_event(_receipt("exp-2", NOW + 5000)))
    task = _task(ReceiptTrust.build(None, VERIFIED))
    out = task.fold(_steps() + [Rec("agent.outcomes", 0, 0, b"r", _receipt("exp-1", NOW + 4000)),
                                Rec("agent.outcomes", 0, 1, b"r", encode(signed))])
    assert [t.to_state for t in out.transitions] == ["RUNNING", "VERIFYING"]
    assert out.counts["receipt", "untrusted_unsigned"] == 1 and out.counts["receipt", "untrusted_unknown_key"] == 1


def test_with_no_trust_setting_receipts_reach_the_core_as_they_are() -> None:
    """Neither setting: ReceiptTrust.build gives None, every receipt counts and evidence has no receipt_trust."""
    assert ReceiptTrust.build(None, None) is None
    task = _task(None)
    out = task.fold(_steps() + [Rec("agent.outcomes", 0, 0, b"r", _receipt("exp-1", NOW + 5000))])
    assert out.transitions[-1].to_state == "VERIFIED_COMPLETE"
    assert out.transitions[-1].evidence.receipt_trust is msgspec.UNSET


def test_replay_fed_the_channel_gives_the_workers_transitions() -> None:
    """Replay with the same trust and on_channel for the channel's receipts: the same transitions as the task."""
    key = SigningKey.generate("dest-1")
    trust = ReceiptTrust(TrustedVerifiers.parse(key.setting), VERIFIED)
    steps = _steps()
    recs = steps + [Rec("agent.outcomes", 0, 0, b"r", _receipt("exp-1", NOW + 5000)),
                    Rec(VERIFIED, 0, 0, b"r", _receipt("exp-1", NOW + 6000))]
    worker = _task(trust).fold(recs).transitions
    replay = Replay(verifiers=TrustedVerifiers.parse(key.setting), channel=VERIFIED)
    replayed = []
    for rec in recs:
        replayed += replay.feed(decode_input(rec.value), on_channel=rec.topic == VERIFIED)
    strip = [msgspec.structs.replace(t, emitted_ts=0) for t in worker]
    assert strip == [msgspec.structs.replace(t, emitted_ts=0) for t in replayed]


def test_a_lagging_verified_topic_holds_later_steps_back() -> None:
    """Stream-time alignment waits for the verifiers' topic as for agent.outcomes."""
    assert "verified_outcomes" in ALIGNED
    stream = StreamTime(ROLES, ALIGNED)
    step_item = (Rec("agent.steps", 0, 0, b"r", b""), ("steps", decode_input(json.dumps(
        {**started(), "ts": NOW}).encode()), None))
    limits = stream.limits({"agent.steps": [step_item]}, {"verified_outcomes"})
    assert limits == {"steps": -1, "outcomes": -1}


def test_the_setting_adds_the_topic_to_the_layout_and_the_stage_and_nothing_without_it() -> None:
    """Co-partitioned, wanted, watched, and a third tracked input; unset, none of these."""
    before = Config()
    assert VERIFIED not in co_partitioned(before) and VERIFIED not in wanted(before)
    assert [i.role for i in HealthStage(before, HealthMetrics(EngineMetrics())).inputs] == ["steps", "outcomes", "ticks"]
    c = Config(trusted_outcomes_topic=VERIFIED, partitions=4)
    assert co_partitioned(c)[:3] == ["agent.steps", "agent.outcomes", VERIFIED] and VERIFIED in wanted(c)
    stage = HealthStage(c, HealthMetrics(EngineMetrics()))
    assert [(i.topic, i.role, i.tracked) for i in stage.inputs][2] == (VERIFIED, "verified_outcomes", True)
    assert stage.roles[VERIFIED] == "verified_outcomes" and stage.trust.by_channel == "channel:" + VERIFIED
    counts = {t: 4 for t in co_partitioned(c)} | {"agent.health": 4, "agent.deadletter": 4}
    layout = plan(c, counts | {VERIFIED: 8})
    assert layout.wrong == {VERIFIED: 8} and VERIFIED in layout.problem()
    verdict = assess(c, counts | {VERIFIED: 8}, {})
    assert not verdict.fold and f"{VERIFIED} has 8 partitions" in verdict.reason()


def test_the_settings_come_from_the_environment_and_a_bad_topic_is_named() -> None:
    """LOOPWARDEN_TRUSTED_OUTCOMES_TOPIC and _WITHOUT_ACL=1 are read; a bad or clashing name stops startup."""
    c = from_env(environ={"LOOPWARDEN_TRUSTED_OUTCOMES_TOPIC": VERIFIED, "LOOPWARDEN_TRUSTED_OUTCOMES_WITHOUT_ACL": "1"})
    assert c.trusted_outcomes_topic == VERIFIED and c.trusted_outcomes_without_acl is True
    with pytest.raises(ConfigError, match="trusted_outcomes_topic: 'a b' is not a valid Kafka topic name"):
        Config(trusted_outcomes_topic="a b")
    with pytest.raises(ConfigError, match="topic names must differ"):
        Config(trusted_outcomes_topic="agent.outcomes")


def test_a_cluster_without_an_authorizer_is_refused_naming_the_setting_and_the_override() -> None:
    """No authorizer, or none readable: one line naming the topic setting and the override; enforced: none."""
    c = Config(trusted_outcomes_topic=VERIFIED)
    why = problem(c, Authorizer({1: ""}, {1: False}))
    assert why is not None and why.startswith(f"LOOPWARDEN_TRUSTED_OUTCOMES_TOPIC={VERIFIED}: the cluster has no "
                                              "authorizer (broker(s) [1]")
    assert "LOOPWARDEN_TRUSTED_OUTCOMES_WITHOUT_ACL=1" in why
    unknown = problem(c, Authorizer({}, {}, "ClusterAuthorizationFailedError"))
    assert unknown is not None and "cannot tell whether the cluster enforces ACLs" in unknown
    enforced = Authorizer({1: "org.apache.kafka.metadata.authorizer.StandardAuthorizer"}, {1: False})
    assert problem(c, enforced) is None and enforced.describe() == "org.apache.kafka.metadata.authorizer.StandardAuthorizer"


_KEY = SigningKey.generate("dest-1")
_FLEET = fleet(60, seed=23, bad_every=0)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ways=st.lists(st.sampled_from(["channel", "signed", "unsigned"]), min_size=1, max_size=40),
       batch=st.sampled_from([1, 7, 10_000]))
def test_the_task_agrees_with_replay_whichever_way_each_receipt_comes(ways, batch) -> None:
    """Receipts on the channel, signed on agent.outcomes or unsigned there: worker final states = replay's."""
    trust = ReceiptTrust(TrustedVerifiers.parse(_KEY.setting), VERIFIED)
    replay = Replay(verifiers=TrustedVerifiers.parse(_KEY.setting), channel=VERIFIED, keep_final=True)
    per_partition: dict[int, list[Rec]] = {}
    offsets: Counter = Counter()
    n = 0
    for m in _FLEET:
        topic, value = "agent.steps", m.value
        if m.topic == "outcomes":
            way = ways[n % len(ways)]
            n += 1
            topic = VERIFIED if way == "channel" else "agent.outcomes"
            if way == "signed":
                value = encode(_KEY.sign(decode_outcome_event(m.value)))
        p = zlib.crc32(m.key) % 2
        per_partition.setdefault(p, []).append(Rec(topic, p, offsets[topic, p], m.key, value))
        offsets[topic, p] += 1
        replay.feed(decode_input(value), on_channel=topic == VERIFIED)
    last = max(m.ts for m in _FLEET) + 3_600_000
    replay.advance_to(last)
    got: dict[str, HealthTransition] = {}
    for p, recs in per_partition.items():
        store: dict = {}
        task = PartitionTask(p, store, ROLES, settings=Settings(), clock="event", wall_ms=lambda: last, trust=trust)
        tick = Rec("loopwarden.ticks", p, 0, None, encode_tick(Tick(now_ms=last)))
        for i in range(0, len(recs) + 1, batch):
            out = task.fold(recs[i:i + batch] + ([tick] if i + batch > len(recs) else []))
            task.committed(out)
            store.update({k: v for k, v in out.changes.items() if v is not None})
            for t in out.transitions:
                got[t.run_id] = t
    assert {r: t.to_state for r, t in got.items()} == {r: t.to_state for r, t in replay.final.items()}
    assert {r: t.evidence.receipt_trust for r, t in got.items()} == \
           {r: t.evidence.receipt_trust for r, t in replay.final.items()}


def test_the_verifier_publishes_to_the_trusted_topic_when_set_and_connects_with_the_security_settings(
        monkeypatch) -> None:
    """VerifyConfig: outcomes topic by default, the env's trusted topic when set, the flag over both; SASL from env."""
    from loopwarden.verify.config import VerifyConfigError, load
    from loopwarden.verify.service import kafka_options

    monkeypatch.delenv("LOOPWARDEN_TRUSTED_OUTCOMES_TOPIC", raising=False)
    assert load(None).receipts_topic == "agent.outcomes"
    monkeypatch.setenv("LOOPWARDEN_TRUSTED_OUTCOMES_TOPIC", VERIFIED)
    assert load(None).receipts_topic == VERIFIED
    assert load(None, {"trusted_outcomes_topic": "other.verified"}).receipts_topic == "other.verified"
    with pytest.raises(VerifyConfigError, match="trusted_outcomes_topic: 'no way' is not a valid Kafka topic name"):
        load(None, {"trusted_outcomes_topic": "no way"})
    for name, value in (("SECURITY_PROTOCOL", "SASL_PLAINTEXT"), ("SASL_MECHANISM", "SCRAM-SHA-256"),
                        ("SASL_USERNAME", "verifier"), ("SASL_PASSWORD", "pw")):
        monkeypatch.setenv("LOOPWARDEN_" + name, value)
    options = kafka_options(load(None, {"broker": "10.0.0.1:9093"}))
    assert options == {"bootstrap_servers": "10.0.0.1:9093", "security_protocol": "SASL_PLAINTEXT",
                       "sasl_mechanism": "SCRAM-SHA-256", "sasl_plain_username": "verifier",
                       "sasl_plain_password": "pw"}
