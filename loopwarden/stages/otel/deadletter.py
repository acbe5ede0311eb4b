"""A bad ``otlp_spans`` message's dead letter: a content-free description, never its bytes.

A TracesData message holds every prompt, tool argument and result the runtime recorded, so the
bridge never forwards one. What it dead-letters instead (JSON, ``content-type: application/json``)
is the message's shape: its size and encoding, the error, and for a message that decodes, every
span's ids, times, status and attribute keys, with the values of the attributes the bridge maps
(spans.KNOWN but LangChain's metadata; scalars only) and of ``exception.type``. Every other value
is ``null``; span and event names are left out (an application may write text there). ``refused``
says why a span was refused. The record keeps its source's topic, partition and offset, and its
key when that is a trace id.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import msgspec

from loopwarden.stages.otel.spans import JSONTEXT, KNOWN, STRS, Refused, is_json

MAX_DESCRIBED_SPANS = 2_000  # the rest of a huge message is counted, not described
HEADERS = (("content-type", b"application/json"),)
_encode = msgspec.json.Encoder().encode
_any = msgspec.json.Decoder()
# The attributes whose values are described: the mapped ones, but not LangChain's metadata (JSON that may
# hold the application's own metadata: the bridge reads a few keys of it, never copies it).
SHOWN = frozenset(key for key, kind in KNOWN.items() if kind != JSONTEXT)


class Described(NamedTuple):
    """Stands for the consumed record in a DeadLetter: its place, and the description as its value."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes
    headers: tuple = HEADERS


def describe(rec: Any, reason: str, error: str, refused: list[Refused] = ()) -> Described:
    """The content-free stand-in of ``rec`` (a consumed ``otlp_spans`` record) for its dead letter."""
    data = rec.value if rec.value is not None else b""
    content_type = _header(rec.headers, "content-type")
    json = bool(data) and is_json(data, content_type)
    doc: dict[str, Any] = {
        "content_free": True,
        "bytes": len(data),
        "encoding": "otlp_json" if json else "otlp_proto",
        "reason": reason,
        "error": error,
    }
    if refused:
        doc["refused_spans"] = len(refused)
    by_span = {r.span_id: f"{r.reason}: {r.error}" for r in refused if r.span_id}
    try:
        shape = _json_shape(data, by_span) if json else _proto_shape(data, by_span)
    except Exception:  # not TracesData (the error says why): size, error and key are what can be read
        shape = None
    if shape is not None:
        doc["resource_spans"], omitted = shape
        if omitted:
            doc["spans_not_described"] = omitted
    key = rec.key if rec.key is not None and _is_trace_id(rec.key) else None
    return Described(rec.topic, rec.partition, rec.offset, key, _encode(doc))


def _is_trace_id(key: bytes) -> bool:
    if len(key) != 32:
        return False
    try:
        bytes.fromhex(key.decode("ascii"))
    except ValueError:
        return False
    return True


def _header(headers, name: str) -> str | None:
    for k, v in headers or ():
        if k == name:
            return v.decode("utf-8", "replace") if isinstance(v, (bytes, bytearray)) else str(v)
    return None


def _scalar(value: Any, key: str = "") -> Any:
    """A mapped attribute's value as described: a scalar as it is, a string array only where the mapping reads
    one (finish reasons), anything else by its type (a container under a scalar key was never read)."""
    if value is None or isinstance(value, (str, int, float, bool)):
        return value if not isinstance(value, str) else value[:200]
    if KNOWN.get(key) == STRS and isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        return [v[:200] for v in value[:16]]
    return f"<{type(value).__name__}>"


class _Budget:
    def __init__(self) -> None:
        self.left = MAX_DESCRIBED_SPANS
        self.omitted = 0


def _span_doc(trace_id: str, span_id: str, parent_id: str, start: Any, end: Any, code: int,
              attrs: dict[str, Any], events: list[dict], by_span: dict[str, str]) -> dict:
    doc = {"trace_id": trace_id, "span_id": span_id, "parent_id": parent_id, "start_ns": start, "end_ns": end,
           "status": code, "attributes": attrs}
    if events:
        doc["events"] = events
    why = by_span.get(span_id)
    if why is not None:
        doc["refused"] = why
    return doc


# -- protobuf ---------------------------------------------------------------------------
def _proto_shape(data: bytes, by_span: dict[str, str]) -> tuple[list, int]:
    from opentelemetry.proto.trace.v1.trace_pb2 import TracesData

    from loopwarden.stages.otel.spans import _proto_value

    traces = TracesData.FromString(data)
    budget = _Budget()
    out = []
    for rs in traces.resource_spans:
        scopes = []
        for ss in rs.scope_spans:
            spans = []
            for sp in ss.spans:
                if budget.left <= 0:
                    budget.omitted += 1
                    continue
                budget.left -= 1
                attrs = {kv.key[:200]: _scalar(_proto_value(kv.value), kv.key) if kv.key in SHOWN else None
                         for kv in sp.attributes}
                events = [{"exception": ev.name == "exception",
                           "attributes": {kv.key[:200]: (_scalar(_proto_value(kv.value))
                                                   if ev.name == "exception" and kv.key == "exception.type" else None)
                                          for kv in ev.attributes}} for ev in sp.events]
                spans.append(_span_doc(sp.trace_id.hex(), sp.span_id.hex(), sp.parent_span_id.hex(),
                                       sp.start_time_unix_nano, sp.end_time_unix_nano, sp.status.code, attrs, events,
                                       by_span))
            scopes.append({"scope": ss.scope.name[:200], "version": ss.scope.version[:200],
                           "attributes": dict.fromkeys(kv.key[:200] for kv in ss.scope.attributes), "spans": spans})
        out.append({"resource": dict.fromkeys(kv.key[:200] for kv in rs.resource.attributes), "scope_spans": scopes})
    return out, budget.omitted


# -- OTLP/JSON ----------------------------------------------------------------------------
def _json_shape(data: bytes, by_span: dict[str, str]) -> tuple[list, int] | None:
    from loopwarden.stages.otel.spans import _any as any_value

    doc = _any.decode(data)
    if not isinstance(doc, dict) or not isinstance(doc.get("resourceSpans"), list):
        return None
    budget = _Budget()

    def keys(items: Any) -> dict:
        return dict.fromkeys(str(kv.get("key"))[:200] for kv in _list(items) if isinstance(kv, dict))

    out = []
    for rs in doc["resourceSpans"]:
        if not isinstance(rs, dict):
            continue
        scopes = []
        for ss in _list(rs.get("scopeSpans")):
            if not isinstance(ss, dict):
                continue
            spans = []
            for sp in _list(ss.get("spans")):
                if not isinstance(sp, dict):
                    continue
                if budget.left <= 0:
                    budget.omitted += 1
                    continue
                budget.left -= 1
                attrs = {}
                for kv in _list(sp.get("attributes")):
                    if isinstance(kv, dict):
                        key = kv.get("key")
                        attrs[str(key)[:200]] = _scalar(any_value(kv.get("value")), key) if key in SHOWN else None
                events = []
                for ev in _list(sp.get("events")):
                    if isinstance(ev, dict):
                        exc = ev.get("name") == "exception"
                        events.append({"exception": exc, "attributes": {
                            str(kv.get("key"))[:200]: (_scalar(any_value(kv.get("value")))
                                                 if exc and kv.get("key") == "exception.type" else None)
                            for kv in _list(ev.get("attributes")) if isinstance(kv, dict)}})
                status = sp.get("status")
                code = status.get("code", 0) if isinstance(status, dict) else 0
                spans.append(_span_doc(_id(sp.get("traceId")), _id(sp.get("spanId")), _id(sp.get("parentSpanId")),
                                       _time(sp.get("startTimeUnixNano")), _time(sp.get("endTimeUnixNano")),
                                       code if isinstance(code, int) else 0, attrs, events, by_span))
            scope = ss.get("scope") if isinstance(ss.get("scope"), dict) else {}
            scopes.append({"scope": str(scope.get("name", ""))[:200], "version": str(scope.get("version", ""))[:200],
                           "attributes": keys(scope.get("attributes")), "spans": spans})
        resource = rs.get("resource") if isinstance(rs.get("resource"), dict) else {}
        out.append({"resource": keys(resource.get("attributes")), "scope_spans": scopes})
    return out, budget.omitted


def _list(value: Any) -> list:
    return value if isinstance(value, list) else []


def _id(value: Any) -> str:
    """An id as the producer wrote it, when it is hex (anything else is not an id, and is not copied)."""
    if isinstance(value, str) and len(value) <= 64:
        try:
            bytes.fromhex(value)
            return value
        except ValueError:
            pass
    return "" if value in (None, "") else "<not hex>"


def _time(value: Any) -> int | str:
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.isdigit() and len(value) <= 20:
        return int(value)
    return "<not a time>"
