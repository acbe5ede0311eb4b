"""Decode and encode events as JSON or MessagePack; export the JSON Schema.

Decoders and encoders are built once, at import. Every failure is an
:class:`InvalidEvent` with a bounded ``reason`` (for metrics and dead-letter
headers) and a message naming the field and, where it can be found, the bad value.
"""

from __future__ import annotations

import re
import sys
from typing import Any, Union

import msgspec

from loopwarden.codecs.events import (
    HealthTransition,
    InputEvent,
    OutcomeEvent,
    StepEvent,
)
from loopwarden.codecs.exceptions import InvalidEvent

JSON = "application/json"
MSGPACK = "application/msgpack"
CONTENT_TYPES = (JSON, MSGPACK)

# Anything bigger is not a content-free event; refuse it before parsing.
MAX_EVENT_BYTES = 256 * 1024

_json_any = msgspec.json.Decoder()
_msgpack_any = msgspec.msgpack.Decoder()
_decoders = {
    (union_name, ctype): dec
    for union_name, union in (("input", InputEvent), ("steps", StepEvent), ("outcomes", OutcomeEvent))
    for ctype, dec in (
        (JSON, msgspec.json.Decoder(union)),
        (MSGPACK, msgspec.msgpack.Decoder(union)),
    )
}
_transition_json = msgspec.json.Decoder(HealthTransition)
_json_encoder = msgspec.json.Encoder()
_msgpack_encoder = msgspec.msgpack.Encoder()

_PATH = re.compile(r" - at `\$(?P<path>[^`]*)`$")
_STEP = re.compile(r"\.([A-Za-z_][A-Za-z0-9_]*)|\[(\d+)\]")
_TYPES_BY_UNION = {
    "input": ("run_started", "step_finished", "run_ended", "approval_routed", "approval_resolved",
              "segment_started", "run_active", "events_dropped", "outcome_expected", "outcome_receipt"),
    "steps": ("run_started", "step_finished", "run_ended", "approval_routed", "approval_resolved",
              "segment_started", "run_active", "events_dropped", "outcome_expected"),
    "outcomes": ("outcome_receipt",),
}


def _lookup(doc: Any, path: str) -> tuple[bool, Any]:
    """Follow a msgspec error path (``.a[0].b``) into a loosely decoded document."""
    node = doc
    for name, index in _STEP.findall(path):
        try:
            node = node[name] if name else node[int(index)]
        except (KeyError, IndexError, TypeError):
            return False, None
    return True, node


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _explain(exc: msgspec.ValidationError, data: bytes, content_type: str, union: str) -> InvalidEvent:
    msg = str(exc)
    m = _PATH.search(msg)
    path = m.group("path") if m else ""
    field_name = "$" + path
    try:
        loose = (_json_any if content_type == JSON else _msgpack_any).decode(data)
    except (msgspec.DecodeError, RecursionError):
        loose = None
    found, value = _lookup(loose, path) if m else (False, None)
    if path == ".type" or (not path and "type" in msg and isinstance(loose, dict) and "type" not in loose):
        if not (isinstance(loose, dict) and "type" in loose):
            return InvalidEvent("missing_type", "missing required field `type`", field="$.type")
        allowed = ", ".join(_TYPES_BY_UNION[union])
        return InvalidEvent(
            "unknown_type",
            f"unknown event type {_short(loose['type'])} at `$.type` (expected one of: {allowed})",
            field="$.type",
            value=_short(loose["type"]),
        )
    if msg.startswith("Object missing required field"):
        return InvalidEvent("missing_field", msg, field=field_name)
    if found:
        return InvalidEvent("invalid_field", f"{msg}; got {_short(value)}", field=field_name, value=_short(value))
    return InvalidEvent("invalid_field", msg, field=field_name)


def _decode(data: bytes, content_type: str | None, union: str) -> Any:
    ctype = content_type or JSON
    if ctype not in CONTENT_TYPES:
        raise InvalidEvent("unsupported_content_type", f"unsupported content-type {_short(ctype)} (expected {JSON} or {MSGPACK})", value=_short(ctype))
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise InvalidEvent("undecodable", f"expected bytes, got {type(data).__name__}")
    if len(data) > MAX_EVENT_BYTES:
        raise InvalidEvent("too_large", f"event of {len(data)} bytes exceeds the {MAX_EVENT_BYTES}-byte limit", value=str(len(data)))
    try:
        return _decoders[(union, ctype)].decode(data)
    except msgspec.ValidationError as exc:
        raise _explain(exc, bytes(data), ctype, union) from exc
    except msgspec.DecodeError as exc:
        raise InvalidEvent("undecodable", f"not valid {'JSON' if ctype == JSON else 'MessagePack'}: {exc}") from exc
    except RecursionError:
        # msgspec decodes (and skips unknown fields) recursively: a document nested deeper than
        # Python's recursion limit (~1,000 levels; no valid event comes close) is refused as such.
        raise InvalidEvent("too_deep", f"{'JSON' if ctype == JSON else 'MessagePack'} nested deeper than the decoder's "
                           f"limit (about {sys.getrecursionlimit()} levels)") from None


def unchecked_decoder(union: str, content_type: str) -> Any:
    """msgspec's decode function of one union (``input``, ``steps``, ``outcomes``) and content type, alone:
    no content-type, type or size checks and no :class:`InvalidEvent` (its errors are msgspec's). For a
    shell's hot path that tries it on records the checked functions would accept, and on any error
    decodes again with the checked one, which says what is wrong."""
    return _decoders[(union, content_type)].decode


def decode_input(data: bytes, content_type: str | None = None) -> InputEvent:
    """Decode any input event (replay reads every input type from one stream).

    Raises
    ------
    InvalidEvent
        With a bounded ``reason`` and a message naming the field and bad value.
    """
    return _decode(data, content_type, "input")


def decode_step_event(data: bytes, content_type: str | None = None) -> StepEvent:
    """Decode an event of the ``agent.steps`` topic."""
    return _decode(data, content_type, "steps")


def decode_outcome_event(data: bytes, content_type: str | None = None) -> OutcomeEvent:
    """Decode an event of the ``agent.outcomes`` topic."""
    return _decode(data, content_type, "outcomes")


def decode_transition(data: bytes) -> HealthTransition:
    """Decode a ``health_transition`` (JSON), as consumers of ``agent.health`` do."""
    try:
        return _transition_json.decode(data)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise InvalidEvent("invalid_transition", str(exc)) from exc
    except RecursionError:
        raise InvalidEvent("invalid_transition", "nested deeper than the decoder's limit") from None


def encode(obj: Any, content_type: str = JSON) -> bytes:
    """Encode an event (input or output) as JSON (default) or MessagePack."""
    if content_type == MSGPACK:
        return _msgpack_encoder.encode(obj)
    return _json_encoder.encode(obj)


def json_schema() -> dict[str, Any]:
    """The JSON Schema of every input and output event, generated from the Structs.

    The top level is ``anyOf`` the input events (tagged by ``type``) and the
    ``health_transition``; ``$defs`` names each event so producers can validate
    one type (``#/$defs/RunEnded``).
    """
    schema = msgspec.json.schema(Union[InputEvent, HealthTransition])
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "loopwarden events"
    schema["description"] = (
        "Input events on agent.steps / agent.outcomes and health_transition on agent.health. "
        "Generated from loopwarden.codecs; unknown fields are allowed (schema evolution)."
    )
    return schema

