"""The pure decoders under fuzzing: whatever the bytes and the content-type header, a decoder returns a
valid event or raises InvalidEvent with a reason from its bounded set — never anything else."""

from __future__ import annotations

import json

import msgspec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loopwarden.codecs import (
    JSON,
    MSGPACK,
    InvalidEvent,
    decode_input,
    decode_outcome_event,
    decode_step_event,
    decode_transition,
    encode,
)
from tests import strategies as S

DECODERS = (decode_input, decode_step_event, decode_outcome_event)
CONTENT_TYPES = st.sampled_from([None, JSON, MSGPACK, "text/plain", "", "application/json; charset=utf-8"])
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats(allow_nan=True) | st.text(max_size=30),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=30,
)


def _decode_all(data: bytes, content_type: str | None) -> None:
    for decode in DECODERS:
        try:
            decode(data, content_type)
        except InvalidEvent as exc:
            assert exc.reason in InvalidEvent.REASONS, exc.reason
            assert str(exc)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(event=S.any_event, content_type=CONTENT_TYPES, data=st.data())
def test_mutated_valid_events(event, content_type, data) -> None:
    """A valid event, encoded either way, then cut, spliced, overwritten or given a field of any JSON value."""
    raw = bytearray(encode(event, data.draw(st.sampled_from([JSON, MSGPACK]))))
    op = data.draw(st.integers(0, 4))
    if op == 0:
        raw = raw[: data.draw(st.integers(0, len(raw)))]
    elif op == 1:
        at = data.draw(st.integers(0, len(raw)))
        raw[at:at] = data.draw(st.binary(max_size=20))
    elif op == 2 and raw:
        for _ in range(data.draw(st.integers(1, 4))):
            raw[data.draw(st.integers(0, len(raw) - 1))] = data.draw(st.integers(0, 255))
    elif op == 3:
        doc = json.loads(encode(event))
        doc[data.draw(st.sampled_from(sorted(doc) + ["x_new"]))] = data.draw(json_values)
        raw = bytearray(json.dumps(doc).encode())
    else:
        depth = data.draw(st.integers(1, 50_000))
        raw = bytearray(json.dumps(json.loads(encode(event)))[:-1].encode() + b', "x": ' + b"[" * depth + b"]" * depth + b"}")
    _decode_all(bytes(raw), content_type)


@settings(max_examples=400, deadline=None)
@given(value=json_values, content_type=CONTENT_TYPES, packed=st.booleans())
def test_any_document(value, content_type, packed) -> None:
    _decode_all(msgspec.msgpack.encode(value) if packed else json.dumps(value).encode(), content_type)


@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=2000), content_type=CONTENT_TYPES)
def test_any_bytes(data, content_type) -> None:
    _decode_all(data, content_type)
    try:
        decode_transition(data)
    except InvalidEvent as exc:
        assert exc.reason == "invalid_transition"
