"""Wire types: what decodes, what does not, and what the errors say."""

from __future__ import annotations

import json

import msgspec
import pytest

from loopwarden.codecs import (
    MSGPACK,
    InvalidEvent,
    RunEnded,
    decode_input,
    decode_outcome_event,
    decode_step_event,
    encode,
)
from tests.builders import approval, ended, receipt, started, step

GOOD = {
    "run_started": started(ts=1),
    "step_finished": step(0, ("lookup", "result"), ts=1),
    "run_ended": ended("natural_finish", 1, ts=1),
    "outcome_receipt": receipt("rc", ts=1),
}


def _b(obj) -> bytes:
    return obj if isinstance(obj, bytes) else json.dumps(obj).encode()


BAD = [
    # (case, input, reason, message regex)
    ("truncated JSON", b'{"type":"step_fin', "undecodable", r"not valid JSON: Input data was truncated"),
    ("not an object", b"[1, 2]", "invalid_field", r"Expected `object`, got `array`"),
    ("unknown type", {"type": "step_started", "run_id": "r", "ts": 1}, "unknown_type",
     r"unknown event type 'step_started' at `\$.type`"),
    ("missing type", {"run_id": "r", "ts": 1}, "missing_type", r"missing required field `type`"),
    ("wrong type for ts", {**GOOD["step_finished"], "ts": "1"}, "invalid_field",
     r"Expected `int`, got `str` - at `\$.ts`; got '1'"),
    ("negative ts", {**GOOD["step_finished"], "ts": -5}, "invalid_field", r"Expected `int` >= 0 - at `\$.ts`; got -5"),
    ("oversize run_id", {**GOOD["step_finished"], "run_id": "x" * 201}, "invalid_field",
     r"Expected `str` of length <= 200 - at `\$.run_id`; got 'xxxx"),
    ("empty run_id", {**GOOD["step_finished"], "run_id": ""}, "invalid_field", r"length >= 1 - at `\$.run_id`; got ''"),
    ("oversize agent", {**GOOD["run_started"], "agent": "a" * 101}, "invalid_field", r"length <= 100 - at `\$.agent`"),
    ("missing field", {k: v for k, v in GOOD["step_finished"].items() if k != "step"}, "missing_field",
     r"Object missing required field `step`"),
    ("unknown finish reason", {**GOOD["step_finished"], "finish_reason": "done"}, "invalid_field",
     r"Invalid enum value 'done' - at `\$.finish_reason`"),
    ("unknown tool status", step(0, ("a", "finished"), ts=1), "invalid_field",
     r"Invalid enum value 'finished' - at `\$.tool_calls\[0\].status`"),
    ("negative tokens", {**GOOD["step_finished"], "usage": {"total_tokens": -1}}, "invalid_field",
     r"at `\$.usage.total_tokens`; got -1"),
    ("approval missing for approval_required", ended("approval_required", 1, ts=1), "invalid_field",
     r"`approval` is required when cause is 'approval_required', got null"),
    ("approval key absent (required, nullable)", {k: v for k, v in GOOD["run_ended"].items() if k != "approval"},
     "missing_field", r"missing required field `approval`"),
    ("null where no null is allowed", {**GOOD["run_ended"], "step_count": None}, "invalid_field",
     r"Expected `int`, got `null` - at `\$.step_count`"),
    ("empty tools list", started(ts=1, stop_when=[{"kind": "tool_call", "tools": []}]), "invalid_field",
     r"length >= 1 - at `\$.policy.stop_when\[0\].tools`; got \[\]"),
    ("custom condition without role", started(ts=1, stop_when=[{"kind": "custom", "name": "x"}]), "missing_field",
     r"missing required field `role` - at `\$.policy.stop_when\[0\]`"),
    ("custom condition with a bad role", started(ts=1, stop_when=[{"kind": "custom", "name": "x", "role": "goal"}]),
     "invalid_field", r"Invalid enum value 'goal' - at `\$.policy.stop_when\[0\].role`"),
    ("unknown condition kind", started(ts=1, stop_when=[{"kind": "wall_clock"}]), "invalid_field",
     r"Invalid value 'wall_clock' - at `\$.policy.stop_when\[0\].kind`"),
    ("negative step_count condition", started(ts=1, stop_when=[{"kind": "step_count", "count": -1}]), "invalid_field",
     r">= 0 - at `\$.policy.stop_when\[0\].count`; got -1"),
    ("zero token budget", started(ts=1, stop_when=[{"kind": "token_budget", "max_tokens": 0}]), "invalid_field",
     r">= 1 - at `\$.policy.stop_when\[0\].max_tokens`; got 0"),
    ("zero inactivity timeout", started(ts=1, inactivity_timeout_s=0), "invalid_field",
     r"> 0.0 - at `\$.policy.inactivity_timeout_s`; got 0"),
    ("unknown required outcome kind", started(ts=1, required_outcomes=["invoice"]), "invalid_field",
     r"Invalid enum value 'invoice' - at `\$.policy.required_outcomes\[0\]`"),
    ("unknown verifier", {**GOOD["outcome_receipt"], "verifier": "agent"}, "invalid_field",
     r"Invalid enum value 'agent' - at `\$.verifier`"),
    ("evidence with a nested object", {**GOOD["outcome_receipt"], "evidence": {"a": {"b": 1}}}, "invalid_field",
     r"at `\$.evidence\[...\]`|at `\$.evidence"),
    ("bool for int", {**GOOD["step_finished"], "step": True}, "invalid_field", r"Expected `int`, got `bool` - at `\$.step`"),
    ("too large", b'{"type":"run_started","pad":"' + b"x" * 300_000 + b'"}', "too_large", r"exceeds the 262144-byte limit"),
]


@pytest.mark.parametrize("case,data,reason,message", BAD, ids=[b[0] for b in BAD])
def test_bad_input_names_field_and_value(case, data, reason, message) -> None:
    """Invalid input raises InvalidEvent with a bounded reason and a message naming field and value."""
    with pytest.raises(InvalidEvent, match=message) as info:
        decode_input(_b(data))
    assert info.value.reason == reason


@pytest.mark.parametrize("name", sorted(GOOD))
def test_good_events_decode_and_unknown_fields_are_ignored(name) -> None:
    """Valid events decode; fields the contract does not know are ignored (schema evolution)."""
    event = decode_input(_b({**GOOD[name], "added_in_v2": {"x": [1, 2]}}))
    assert event.__struct_config__.tag == name


def test_defaults_from_the_tables() -> None:
    """Fields with a default in docs/contract.md may be omitted."""
    ev = decode_input(b'{"type":"step_finished","run_id":"r","ts":1,"step":0,"finish_reason":"stop"}')
    assert (ev.segment, ev.tool_calls, ev.usage.total_tokens) == (0, (), None)
    rs = decode_input(b'{"type":"run_started","run_id":"r","ts":1,"agent":"a","policy":{"version":"v"}}')
    assert rs.policy.stop_when is None
    assert (rs.policy.inactivity_timeout_s, rs.policy.receipt_window_s, rs.policy.required_outcomes) == (300.0, 600.0, ())


def test_msgpack_with_the_same_field_names() -> None:
    """MessagePack with the contract's field names decodes to the same event as JSON."""
    data = msgspec.msgpack.encode(GOOD["run_ended"])
    assert decode_input(data, MSGPACK) == decode_input(_b(GOOD["run_ended"]))
    assert isinstance(decode_input(encode(decode_input(data, MSGPACK), MSGPACK), MSGPACK), RunEnded)


def test_topic_specific_decoders_refuse_the_other_topics_events() -> None:
    """agent.steps does not carry receipts, and agent.outcomes carries nothing else."""
    with pytest.raises(InvalidEvent, match=r"unknown event type 'outcome_receipt'") as info:
        decode_step_event(_b(GOOD["outcome_receipt"]))
    assert info.value.reason == "unknown_type"
    with pytest.raises(InvalidEvent, match=r"unknown event type 'run_started'"):
        decode_outcome_event(_b(GOOD["run_started"]))


def test_unsupported_content_type_is_named() -> None:
    """A content-type other than JSON or MessagePack is refused with its name."""
    with pytest.raises(InvalidEvent, match=r"unsupported content-type 'text/xml'"):
        decode_input(b"<x/>", "text/xml")


def test_approval_is_routed_only_with_owner_deadline_and_token() -> None:
    """Approval.routed needs all three routing fields."""
    from loopwarden.codecs import Approval

    assert msgspec.convert(approval(), Approval).routed
    assert not msgspec.convert({**approval(), "owner": None}, Approval).routed


def _deep_json(depth: int) -> bytes:
    """A step_finished whose unknown field ``x`` nests ``depth`` arrays (unknown fields are skipped, recursively)."""
    head = json.dumps(step(0, ("lookup", "result"), ts=1))[:-1].encode()
    return head + b', "x": ' + b"[" * depth + b"]" * depth + b"}"


def _deep_msgpack(depth: int) -> bytes:
    event = step(0, ("lookup", "result"), ts=1)
    head = msgspec.msgpack.encode(event)
    assert head[0] == 0x80 + len(event)  # a fixmap: one more entry is one more in the first byte
    return bytes([head[0] + 1]) + head[1:] + msgspec.msgpack.encode("x") + b"\x91" * depth + b"\xc0"


@pytest.mark.parametrize("make, content_type", [(_deep_json, None), (_deep_msgpack, MSGPACK)])
def test_deep_nesting_is_an_invalid_event_not_a_recursion_error(make, content_type) -> None:
    """100,000 nested arrays inside an unknown field: refused as too_deep, on every decoder."""
    data = make(100_000)
    for decode in (decode_input, decode_step_event):
        with pytest.raises(InvalidEvent) as err:
            decode(data, content_type)
        assert err.value.reason == "too_deep"
        assert "nested deeper" in str(err.value)
    # A known field nested as deep: the type error is found first, the explanation survives the depth.
    bad_field = json.dumps(step(0, ts=1)).replace('"run_id": "r"', '"run_id": ' + "[" * 50_000 + "]" * 50_000).encode()
    assert bad_field != json.dumps(step(0, ts=1)).encode()
    with pytest.raises(InvalidEvent) as err:
        decode_input(bad_field)
    assert err.value.reason == "invalid_field" and err.value.field == "$.run_id"
    # Nesting a real producer could send (100 levels) still decodes.
    assert decode_input(make(100), content_type).step == 0
