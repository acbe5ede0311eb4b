"""Trusted receipts (docs/contract.md section 10): canonical bytes, signatures, the trust check in replay, keys."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loopwarden.codecs import (
    NotCanonical,
    OutcomeExpected,
    OutcomeReceipt,
    Signature,
    canonical_json,
    decode_input,
    decode_outcome_event,
    decode_step_event,
    encode,
    receipt_signing_bytes,
)
from loopwarden.codecs.canonical import number
from loopwarden.replay import Replay
from loopwarden.rules import decode_state, encode_state
from loopwarden.trust import ReceiptTrust, SigningKey, TrustConfigError, TrustedVerifiers
from tests.builders import ended, receipt, started, step, timed
from tests.vectors import make_receipts_golden

REPO = Path(__file__).resolve().parents[2]
TS_GOLDEN = REPO / "emitters" / "ai-sdk" / "test" / "vectors" / "ts-receipts-golden.json"
LW = [sys.executable, "-m", "loopwarden.cli"]


@pytest.mark.parametrize(("value", "text"), [
    (0, "0"), (-0.0, "0"), (1.0, "1"), (0.5, "0.5"), (0.1, "0.1"), (0.1 + 0.2, "0.30000000000000004"),
    (1e21, "1e+21"), (1e20, "100000000000000000000"), (123456789.125, "123456789.125"), (1e-7, "1e-7"),
    (1e-6, "0.000001"), (5e-324, "5e-324"), (1.7976931348623157e308, "1.7976931348623157e+308"),
    (-987.654321, "-987.654321"), (4.35e-10, "4.35e-10"), (1.5e300, "1.5e+300"), (2**53 - 1, "9007199254740991"),
])
def test_numbers_are_written_as_ecmascript_writes_them(value, text) -> None:
    """Each number has the form RFC 8785 takes from ECMAScript's Number::toString."""
    assert number(value) == text


def test_canonical_json_sorts_keys_by_utf16_code_units_and_escapes_as_json_stringify() -> None:
    """Keys in UTF-16 order (an astral character sorts before U+FF61); controls escaped lower-case."""
    assert canonical_json({"\uff61": 1, "\U0001F600": 2, "a": 3, "B": 4}) == '{"B":4,"a":3,"😀":2,"｡":1}'.encode()
    assert canonical_json(["a\u0000\n\"\\/\u007f\u2028"]) == b'["a\\u0000\\n\\"\\\\/\x7f\xe2\x80\xa8"]'


@pytest.mark.parametrize(("value", "message"), [
    ({"n": 2**53}, "integer 9007199254740992 is beyond"),
    ({"n": float("nan")}, "number nan is not finite"),
    ({"n": float("inf")}, "number inf is not finite"),
    ({"n": {1, 2}}, "value of type set"),
])
def test_values_without_a_canonical_form_are_refused_by_name(value, message) -> None:
    """What JavaScript cannot hold exactly (or JSON cannot write) raises NotCanonical naming it."""
    with pytest.raises(NotCanonical, match=message):
        canonical_json(value)


def test_the_committed_python_receipt_vectors_are_current() -> None:
    """tests/vectors/receipts-golden.json is what make_receipts_golden renders (run it after a change)."""
    assert make_receipts_golden.PATH.read_text() == make_receipts_golden.render()


def test_typescript_signed_receipts_have_the_same_canonical_bytes_and_verify_here() -> None:
    """Every receipt the TypeScript emitter signed decodes, re-canonicalizes byte for byte and is trusted."""
    golden = json.loads(TS_GOLDEN.read_text())
    trusted = TrustedVerifiers.parse(golden["trusted"])
    assert len(golden["cases"]) >= 7
    for case in golden["cases"]:
        r = decode_outcome_event(case["receipt"].encode())
        assert receipt_signing_bytes(r) == case["canonical"].encode(), case["receipt"]
        assert trusted.why_untrusted(r) is None, case["receipt"]


def _signed(**kw) -> tuple[SigningKey, TrustedVerifiers, OutcomeReceipt]:
    key = SigningKey.generate("dest-1")
    r = OutcomeReceipt(run_id="r", ts=5, receipt_id="exp-1", kind="file", verifier="destination", verified=True,
                       evidence={"size": 10, "sha256": "ab" * 32, **kw})
    return key, TrustedVerifiers.parse(key.setting), key.sign(r)


def test_a_signed_receipt_is_trusted_after_the_wire_and_any_change_is_not() -> None:
    """JSON and MessagePack round trips keep the signature valid; a changed field, key or sig does not."""
    key, trusted, r = _signed(ratio=0.25)
    assert trusted.why_untrusted(decode_outcome_event(encode(r))) is None
    assert trusted.why_untrusted(decode_outcome_event(encode(r, "application/msgpack"), "application/msgpack")) is None
    assert trusted.why_untrusted(msgspec.structs.replace(r, verified=False)) == "bad_signature"
    assert trusted.why_untrusted(msgspec.structs.replace(r, run_id="other")) == "bad_signature"
    assert trusted.why_untrusted(msgspec.structs.replace(r, evidence={"size": 11})) == "bad_signature"
    assert trusted.why_untrusted(msgspec.structs.replace(r, signature=msgspec.UNSET)) == "unsigned"
    other = SigningKey.generate("dest-1").sign(r)  # same key id, another key: a forgery
    assert trusted.why_untrusted(other) == "bad_signature"
    assert trusted.why_untrusted(SigningKey.generate("intruder").sign(r)) == "unknown_key"
    forged = msgspec.structs.replace(r, signature=msgspec.structs.replace(r.signature, sig="not*base64"))
    assert trusted.why_untrusted(forged) == "bad_signature"
    big = msgspec.structs.replace(r, evidence={"n": 2**60})
    assert trusted.why_untrusted(big) == "not_canonical"


def test_an_unsigned_receipt_encodes_exactly_as_before_signatures_existed() -> None:
    """No `signature` key on the wire when unsigned (old consumers and golden vectors unchanged)."""
    r = decode_outcome_event(json.dumps(receipt("rc")).encode())
    assert b"signature" not in encode(r)


@pytest.mark.parametrize(("text", "message"), [
    ("", "names no key"),
    ("k1", "entry 'k1' is not KEY_ID=PUBLIC_KEY"),
    ("bad id=AAAA", "entry 'bad id=AAAA' is not KEY_ID=PUBLIC_KEY"),
    ("k1=AAAA", "the public key of 'k1', 'AAAA', is not the base64url of a 32-byte Ed25519 public key"),
    ("k1=" + "!" * 43, "the public key of 'k1'"),
])
def test_a_malformed_trusted_verifiers_setting_names_the_bad_value(text, message) -> None:
    """Each malformed entry stops startup with LOOPWARDEN_TRUSTED_VERIFIERS and the entry in the message."""
    with pytest.raises(TrustConfigError, match=f"LOOPWARDEN_TRUSTED_VERIFIERS: .*{message}"):
        TrustedVerifiers.parse(text)


def test_a_key_id_given_twice_is_refused() -> None:
    """Two entries for one key id would make trust depend on order: refused."""
    a, b = SigningKey.generate("k"), SigningKey.generate("k")
    with pytest.raises(TrustConfigError, match="key id 'k' is given twice"):
        TrustedVerifiers.parse(f"{a.setting},{b.setting}")


def _fleet(forged_first: bool) -> tuple[list, SigningKey]:
    key = SigningKey.generate("dest-1")
    events = timed(started(required_outcomes=["file"]), step(0), ended("natural_finish", 1))
    good = key.sign(decode_outcome_event(json.dumps({**receipt("exp-1"), "ts": 1_010_000}).encode()))
    forged = {**receipt("exp-1"), "ts": 1_005_000}  # the agent's own claim: valid JSON, no signature
    wrong = {**json.loads(encode(good)), "ts": 1_006_000, "receipt_id": "exp-2"}  # a copied signature
    decoded = [decode_input(json.dumps(e).encode()) for e in events]
    extra = [decode_input(json.dumps(forged).encode()), decode_input(json.dumps(wrong).encode())]
    return decoded + (extra + [good] if forged_first else [good]), key


def test_with_trusted_verifiers_forged_receipts_change_nothing_and_are_kept_as_untrusted() -> None:
    """Unsigned and re-used signatures: VERIFYING stays; they are in evidence and counted; the signed one decides."""
    events, key = _fleet(forged_first=True)
    replay = Replay(verifiers=TrustedVerifiers.parse(key.setting), keep_final=True)
    out = []
    for ev in events[:-1]:
        out += replay.feed(ev)
    assert [t.to_state for t in out] == ["RUNNING", "VERIFYING"]
    state = replay.states["r"]
    assert state.untrusted_receipt_ids == ["exp-1", "exp-2"] and state.receipt_ids == []
    assert replay.notes[("receipt", "untrusted_unsigned")] == 1
    assert replay.notes[("receipt", "untrusted_bad_signature")] == 1
    last = replay.feed(events[-1])  # the verifier's receipt, same receipt id as the forged one
    assert [(t.to_state, t.reason) for t in last] == [("VERIFIED_COMPLETE", "receipt")]
    assert last[0].evidence.untrusted_receipt_ids == ("exp-1", "exp-2")
    assert last[0].evidence.receipt_ids == ("exp-1",)
    assert last[0].evidence.receipt_trust == {"exp-1": "key:" + key.key_id}
    assert decode_state(encode_state(state), state.run_id) == state


def test_without_trusted_verifiers_every_receipt_counts_as_before() -> None:
    """No setting: the agent's unsigned receipt decides the verdict, exactly as today."""
    events, _key = _fleet(forged_first=True)
    replay = Replay(keep_final=True)
    out = []
    for ev in events:
        out += replay.feed(ev)
    assert [(t.to_state, t.reason) for t in out] == [("RUNNING", "started"), ("VERIFYING", "natural_finish"),
                                                     ("VERIFIED_COMPLETE", "receipt")]
    assert out[-1].evidence.untrusted_receipt_ids is msgspec.UNSET
    assert out[-1].evidence.receipt_trust is msgspec.UNSET


def test_outcome_expected_is_kept_in_evidence_and_changes_no_state() -> None:
    """An expectation neither starts a run nor moves it; its id shows in the next transition's evidence."""
    exp = {"type": "outcome_expected", "run_id": "r", "ts": 999_000, "expectation_id": "exp-1", "kind": "file",
           "target": "file:///srv/out/a.pdf", "checks": {"min_size": 10, "row": {"id": 7}}}
    ev = decode_step_event(json.dumps(exp).encode())
    assert isinstance(ev, OutcomeExpected) and ev.checks["row"] == {"id": 7}
    replay = Replay()
    assert replay.feed(ev) == [] and replay.feed(ev) == []
    assert replay.states["r"].health is None and replay.states["r"].ignored == {"duplicate_expectation": 1}
    out = replay.feed(decode_input(json.dumps({**started(), "ts": 1_000_000}).encode()))
    assert [t.to_state for t in out] == ["RUNNING"] and out[0].evidence.expectation_ids == ("exp-1",)


def test_an_outcome_expected_with_a_bad_kind_names_the_field() -> None:
    """A kind outside the receipt kinds is an invalid event, named by path and value."""
    bad = {"type": "outcome_expected", "run_id": "r", "ts": 1, "expectation_id": "e", "kind": "blob", "target": "x"}
    with pytest.raises(ValueError, match=r"at `\$.kind`; got 'blob'"):
        decode_step_event(json.dumps(bad).encode())


def test_keys_new_writes_a_0600_key_whose_printed_setting_verifies_its_receipts(tmp_path: Path) -> None:
    """`loopwarden keys new` prints KEY_ID=PUBLIC_KEY; the file is owner-only and signs trusted receipts."""
    path = tmp_path / "dest.key"
    proc = subprocess.run([*LW, "keys", "new", "--key-id", "dest-1", "--out", str(path)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    trusted = TrustedVerifiers.parse(proc.stdout.strip())
    key = SigningKey.load(path)
    r = OutcomeReceipt(run_id="r", ts=1, receipt_id="x", kind="file", verifier="destination", verified=True)
    assert trusted.why_untrusted(key.sign(r)) is None
    again = subprocess.run([*LW, "keys", "new", "--key-id", "dest-1", "--out", str(path)], capture_output=True, text=True)
    assert again.returncode != 0 and "exists; refusing to overwrite a key" in again.stderr


def test_replay_reads_trusted_verifiers_from_the_flag_and_names_a_bad_one(tmp_path: Path) -> None:
    """`replay --trusted-verifiers` drops an unsigned receipt's effect; a bad value exits naming it."""
    events = timed(started(), step(0), ended("natural_finish", 1), receipt("rc"))
    f = tmp_path / "e.jsonl"
    f.write_text("".join(json.dumps(e) + "\n" for e in events))
    key = SigningKey.generate("dest-1")
    proc = subprocess.run([*LW, "replay", str(f), "--trusted-verifiers", key.setting], capture_output=True, text=True)
    assert [json.loads(line)["to_state"] for line in proc.stdout.splitlines()] == ["RUNNING", "VERIFYING"]
    env = {**os.environ, "LOOPWARDEN_TRUSTED_VERIFIERS": "dest-1=nope"}
    bad = subprocess.run([*LW, "replay", str(f)], capture_output=True, text=True, env=env)
    assert bad.returncode != 0 and "LOOPWARDEN_TRUSTED_VERIFIERS: the public key of 'dest-1', 'nope'" in bad.stderr


def test_the_worker_task_classifies_receipts_before_the_core_and_counts_the_untrusted() -> None:
    """PartitionTask with verifiers: a forged receipt is counted as untrusted and the run stays VERIFYING."""
    from loopwarden.rules import Settings
    from loopwarden.stages.health.task import PartitionTask
    from tests.unit.test_task import ROLES, Rec

    key = SigningKey.generate("dest-1")
    now = 1_000_000_000
    events = timed(started(), step(0), ended("natural_finish", 1), start=now)
    forged = {**receipt("exp-1"), "ts": now + 5000}
    signed = key.sign(decode_outcome_event(json.dumps({**receipt("exp-1"), "ts": now + 6000}).encode()))
    recs = [Rec("agent.steps", 0, i, b"r", json.dumps(e).encode()) for i, e in enumerate(events)]
    task = PartitionTask(0, {}, ROLES, settings=Settings(), clock="event", wall_ms=lambda: now,
                         trust=ReceiptTrust(TrustedVerifiers.parse(key.setting), None))
    first = task.fold(recs + [Rec("agent.outcomes", 0, 0, b"r", json.dumps(forged).encode())])
    assert [t.to_state for t in first.transitions] == ["RUNNING", "VERIFYING"]
    assert first.counts["receipt", "untrusted_unsigned"] == 1 and not first.deadletters
    task.committed(first)
    task.store = {k: v for k, v in first.changes.items() if v is not None}
    second = task.fold([Rec("agent.outcomes", 0, 1, b"r", encode(signed))])
    assert [(t.to_state, t.reason) for t in second.transitions] == [("VERIFIED_COMPLETE", "receipt")]
    assert second.transitions[0].evidence.untrusted_receipt_ids == ("exp-1",)
    assert second.transitions[0].evidence.receipt_trust == {"exp-1": "key:dest-1"}


_scalar = st.one_of(st.text(max_size=30), st.booleans(), st.integers(min_value=-(2**63), max_value=2**63),
                    st.floats(allow_nan=True, allow_infinity=True))


@settings(max_examples=300, deadline=None)
@given(evidence=st.dictionaries(st.text(max_size=20), _scalar, max_size=8),
       key_id=st.sampled_from(["dest-1", "other"]), sig=st.text(max_size=120))
def test_no_receipt_a_producer_can_send_makes_the_trust_check_raise(evidence, key_id, sig) -> None:
    """Any evidence (huge ints, NaN, surrogates) and any signature text: a why, never an exception."""
    trusted = TrustedVerifiers.parse(SigningKey.generate("dest-1").setting)
    r = OutcomeReceipt(run_id="r", ts=1, receipt_id="x", kind="file", verifier="destination", verified=True,
                       evidence=evidence, signature=Signature(key_id=key_id, sig=sig or "x"))
    assert trusted.why_untrusted(r) in ("unknown_key", "bad_signature", "not_canonical")


@settings(max_examples=400, deadline=None)
@given(evidence=st.dictionaries(st.text(max_size=12), st.one_of(st.text(max_size=30), st.booleans(),
                                                                st.integers(-(2**53 - 1), 2**53 - 1),
                                                                st.floats(allow_nan=False, allow_infinity=False)),
                                max_size=8),
       run_id=st.text(min_size=1, max_size=20))
def test_the_fast_canonical_path_gives_the_same_bytes_as_the_reference(evidence, run_id) -> None:
    """receipt_signing_bytes (msgspec for the common case) equals the RFC 8785 reference, byte for byte."""
    r = OutcomeReceipt(run_id=run_id, ts=7, receipt_id="x", kind="file", verifier="destination", verified=False,
                       evidence=evidence)
    reference = canonical_json({"type": "outcome_receipt", "run_id": run_id, "ts": 7, "receipt_id": "x", "kind": "file",
                                "verifier": "destination", "verified": False, "evidence": evidence})
    assert receipt_signing_bytes(r) == reference


def test_the_worker_refuses_to_start_with_a_malformed_setting_naming_it() -> None:
    """`loopwarden worker` with a bad LOOPWARDEN_TRUSTED_VERIFIERS exits before connecting, naming the entry."""
    env = {**os.environ, "LOOPWARDEN_TRUSTED_VERIFIERS": "dest-1=czxHtgkygQzkk8IBi085hH_mI55pEE6lZswFFPfSlG4,oops"}
    proc = subprocess.run([*LW, "worker", "--broker", "127.0.0.1:1"], capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode != 0
    assert "LOOPWARDEN_TRUSTED_VERIFIERS: entry 'oops' is not KEY_ID=PUBLIC_KEY" in proc.stderr


def _occurrences(replay: Replay, key: SigningKey):
    """The run id ``r`` runs once (verified by a signed receipt), is dropped after retention, and starts again."""
    first = timed(*[started(), step(0, ("lookup", "result")), step(1), ended("natural_finish", 2)])
    for e in first:
        replay.feed(decode_input(json.dumps(e).encode()))
    old = key.sign(OutcomeReceipt(run_id="r", ts=1_010_000, receipt_id="exp-1", kind="file", verifier="destination",
                                  verified=True, run_started_ts=first[0]["ts"]))
    assert [(t.to_state, t.reason) for t in replay.feed(old)] == [("VERIFIED_COMPLETE", "receipt")]
    replay.advance_to(replay.clock + 3_600_000 + 1000)  # retention: dropped to its tomb
    assert replay.states["r"].tomb
    second = timed(*[started(), step(0, ("lookup", "result")), step(1), ended("natural_finish", 2)],
                   start=replay.clock + 1000)
    return old, second


@pytest.mark.parametrize("channel", [False, True], ids=["signed", "by_channel"])
def test_an_old_receipt_resent_to_a_reused_run_id_is_refused_as_stale_before_and_after_the_run_ends(channel) -> None:
    """An old receipt re-sent to a reused run id, before and after the run ends: untrusted_stale, no state change."""
    from loopwarden.rules import Settings

    key = SigningKey.generate("verifier-1")
    replay = Replay(Settings(retention_s=3600, seq_memory_s=86400), verifiers=TrustedVerifiers.parse(key.setting),
                    channel="agent.outcomes.verified" if channel else None)
    old, second = _occurrences(replay, key)
    out = []
    for e in second[:3]:
        out += replay.feed(decode_input(json.dumps(e).encode()))
    out += replay.feed(old, channel)  # before the run ends: it must not decide the verdict to come
    out += replay.feed(decode_input(json.dumps(second[3]).encode()))
    out += replay.feed(old, channel)  # after: still nothing
    assert [(t.to_state, t.reason) for t in out] == [("RUNNING", "started"), ("VERIFYING", "natural_finish")]
    state = replay.states["r"]
    assert state.receipt_ids == [] and state.untrusted_receipt_ids == ["exp-1"] and state.receipt_trust == {}
    assert state.ignored == {"stale_receipt": 2} and replay.notes[("receipt", "untrusted_stale")] == 2
    assert out[-1].evidence.untrusted_receipt_ids == ("exp-1",)
    fresh = key.sign(OutcomeReceipt(run_id="r", ts=second[3]["ts"] + 5000, receipt_id="exp-1", kind="file",
                                    verifier="destination", verified=True, run_started_ts=second[0]["ts"]))
    last = replay.feed(fresh, channel)
    assert [(t.to_state, t.reason) for t in last] == [("VERIFIED_COMPLETE", "receipt")]
    assert last[0].evidence.receipt_ids == ("exp-1",)
    assert decode_state(encode_state(state), state.run_id) == state


def test_an_old_receipt_held_before_the_reused_run_id_starts_is_refused_at_the_start() -> None:
    """An old receipt held before the reused run id's first event is refused when the occurrence starts."""
    from loopwarden.rules import Settings

    key = SigningKey.generate("verifier-1")
    replay = Replay(Settings(retention_s=3600, seq_memory_s=86400), verifiers=TrustedVerifiers.parse(key.setting))
    old, second = _occurrences(replay, key)
    assert replay.feed(old) == [] and replay.states["r"].receipt_ids == ["exp-1"]  # held: no occurrence yet
    out = [t for e in second for t in replay.feed(decode_input(json.dumps(e).encode()))]
    assert [(t.to_state, t.reason) for t in out] == [("RUNNING", "started"), ("VERIFYING", "natural_finish")]
    assert out[0].evidence.untrusted_receipt_ids == ("exp-1",) and out[0].evidence.receipt_ids == ()
    assert replay.notes[("receipt", "untrusted_stale")] == 1


def test_an_unbound_receipt_signed_as_old_verifiers_sign_is_stale_by_its_own_ts() -> None:
    """A receipt without run_started_ts is stale when its signed ts is before the occurrence's start."""
    from loopwarden.rules import Settings

    key = SigningKey.generate("verifier-1")
    replay = Replay(Settings(retention_s=3600, seq_memory_s=86400), verifiers=TrustedVerifiers.parse(key.setting))
    old, second = _occurrences(replay, key)
    unbound = key.sign(msgspec.structs.replace(old, run_started_ts=msgspec.UNSET))
    assert b"run_started_ts" not in receipt_signing_bytes(unbound)
    forged = msgspec.structs.replace(unbound, run_started_ts=second[0]["ts"])  # the binding changed, not re-signed
    for e in second:
        replay.feed(decode_input(json.dumps(e).encode()))
    assert replay.feed(unbound) == [] and replay.feed(forged) == []
    assert replay.notes[("receipt", "untrusted_stale")] == 1 and replay.notes[("receipt", "untrusted_bad_signature")] == 1
    assert replay.states["r"].health == "VERIFYING"


def test_the_signed_bytes_hold_run_started_ts_only_when_it_is_set() -> None:
    """A receipt without the binding signs the bytes it always did; with it, the binding is signed."""
    bare = OutcomeReceipt(run_id="r", ts=5, receipt_id="x", kind="file", verifier="destination", verified=True)
    bound = msgspec.structs.replace(bare, run_started_ts=3)
    assert receipt_signing_bytes(bare) == (b'{"evidence":{},"kind":"file","receipt_id":"x","run_id":"r","ts":5,'
                                           b'"type":"outcome_receipt","verified":true,"verifier":"destination"}')
    assert receipt_signing_bytes(bound) == (b'{"evidence":{},"kind":"file","receipt_id":"x","run_id":"r",'
                                            b'"run_started_ts":3,"ts":5,"type":"outcome_receipt","verified":true,'
                                            b'"verifier":"destination"}')
    assert canonical_json(json.loads(receipt_signing_bytes(bound))) == receipt_signing_bytes(bound)
    assert decode_outcome_event(encode(bound)).run_started_ts == 3
