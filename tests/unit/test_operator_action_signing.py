"""A person's operator action (docs/contract.md section 12): its signed bytes, its signature, `loopwarden act`'s checks."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest

from loopwarden.codecs import encode
from loopwarden.codecs.canonical import canonical_json, action_signing_bytes
from loopwarden.codecs.events import OperatorAction
from loopwarden.operator_action import ActionError, build_action
from loopwarden.trust import SigningKey, TrustedVerifiers

LW = [sys.executable, "-m", "loopwarden.cli"]
TS = 1_780_000_000_000
decode_action = msgspec.json.Decoder(OperatorAction).decode


def action(**kw) -> OperatorAction:
    fields = {"run_id": "run-7", "action": "retry", "reason": "the tool is back up", "ts": TS, "request_id": "req-1"}
    return build_action(**{**fields, **kw})


def test_a_signed_action_verifies_after_the_wire() -> None:
    """An action signed by a trusted key, encoded and decoded as the worker reads it, is trusted."""
    key = SigningKey.generate("alice")
    signed = key.sign_action(action(actor="alice@example.com", run_started_ts=TS - 60_000, override_bound=True))
    back = decode_action(encode(signed))
    assert back == signed and back.signature.key_id == "alice"
    assert TrustedVerifiers.parse(key.setting).why_untrusted(back) is None


@pytest.mark.parametrize("change", [
    {"reason": "something else"}, {"action": "abandon"}, {"run_id": "run-8"}, {"ts": TS + 1},
    {"request_id": "req-2"}, {"override_bound": True}, {"actor": "mallory"}, {"run_started_ts": TS - 1},
])
def test_any_change_to_a_signed_action_breaks_its_signature(change) -> None:
    """Every field the signature covers, changed after signing (or added), makes the action untrusted."""
    key = SigningKey.generate("alice")
    signed = key.sign_action(action())
    tampered = decode_action(encode(msgspec.structs.replace(signed, **change)))
    assert TrustedVerifiers.parse(key.setting).why_untrusted(tampered) == "bad_signature"


def test_an_unsigned_action_or_one_signed_by_an_unknown_key_is_untrusted() -> None:
    """Without a signature, or with a key the workers do not trust, the action is named untrusted."""
    trusted = TrustedVerifiers.parse(SigningKey.generate("alice").setting)
    assert trusted.why_untrusted(action()) == "unsigned"
    assert trusted.why_untrusted(SigningKey.generate("mallory").sign_action(action())) == "unknown_key"


def test_the_signed_bytes_are_the_canonical_json_of_the_action_without_its_signature() -> None:
    """RFC 8785 over every field but the signature: override_bound always, actor and run_started_ts when set."""
    plain = action(reason="é \u2028 \ud800")
    assert action_signing_bytes(plain) == canonical_json(
        {"type": "operator_action", "run_id": "run-7", "ts": TS, "request_id": "req-1", "action": "retry",
         "reason": "é \u2028 \ud800", "override_bound": False})
    full = action(actor="bob", run_started_ts=5)
    assert json.loads(action_signing_bytes(full)) == {
        "type": "operator_action", "run_id": "run-7", "ts": TS, "request_id": "req-1", "action": "retry",
        "reason": "the tool is back up", "override_bound": False, "actor": "bob", "run_started_ts": 5}
    signed = SigningKey.generate("k").sign_action(full)
    assert action_signing_bytes(signed) == action_signing_bytes(full)


def test_each_action_gets_its_own_request_id_unless_given() -> None:
    """Two actions built without a request id differ in it; a given one is kept."""
    a, b = (build_action("r", "retry", "x", ts=TS) for _ in range(2))
    assert a.request_id != b.request_id and len(a.request_id) == 36
    assert build_action("r", "retry", "x", ts=TS, request_id="mine").request_id == "mine"


@pytest.mark.parametrize(("kw", "message"), [
    ({"action": "restart"}, "action 'restart': give one of retry, reverify, escalate, abandon, acknowledge"),
    ({"reason": ""}, "--reason: must not be empty"),
    ({"reason": "x" * 201}, "--reason: at most 200 characters, got 201"),
    ({"run_id": "r" * 201}, "RUN_ID: at most 200 characters, got 201"),
    ({"request_id": " "}, "--request-id: must not be empty"),
    ({"actor": "a\nb"}, "--actor 'a\\nb': no control characters"),
    ({"run_started_ts": -1}, "--run-started-ts -1: a time in ms"),
    ({"action": "abandon", "override_bound": True}, "--override-bound: only a retry can go beyond the bound, not 'abandon'"),
])
def test_a_bad_value_is_refused_naming_it(kw, message) -> None:
    """Each value an action cannot carry raises one message naming the flag and the value."""
    with pytest.raises(ActionError) as exc:
        action(**kw)
    assert str(exc.value).startswith(message)


def test_act_writes_a_signed_action_that_verifies_and_a_bad_value_is_one_line(tmp_path: Path) -> None:
    """`loopwarden act --out -` prints a signed operator_action the key's setting verifies; a bad action is one
    line on stderr, exit 1, nothing printed."""
    key = SigningKey.generate("oncall-1")
    key.save(tmp_path / "key.pem")
    res = subprocess.run([*LW, "act", "run-9", "abandon", "--reason", "customer cancelled", "--key",
                          str(tmp_path / "key.pem"), "--actor", "dana", "--run-started-ts", "1234", "--out", "-"],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    got = decode_action(res.stdout.strip().encode())
    assert (got.run_id, got.action, got.reason, got.actor, got.run_started_ts) == \
        ("run-9", "abandon", "customer cancelled", "dana", 1234)
    assert TrustedVerifiers.parse(key.setting).why_untrusted(got) is None
    res = subprocess.run([*LW, "act", "run-9", "restart", "--reason", "x", "--key", str(tmp_path / "key.pem"),
                          "--out", "-"], capture_output=True, text=True, timeout=60)
    assert res.returncode == 1 and res.stdout == ""
    assert res.stderr.strip() == ("loopwarden act: action 'restart': give one of retry, reverify, escalate, abandon, "
                                  "acknowledge")
