"""TracesData in, content-free spans out: the only place that reads OTLP bytes.

The Collector's Kafka exporter writes one TracesData per message (``otlp_proto``:
protobuf, the default; ``otlp_json``: OTLP/JSON). :func:`decode_traces` turns one
message into :class:`Span` records that keep **only** what the mapping tables
(``loopwarden.stages.otel.mapping``) read: ids, times, status, the span's role, and a few
named attributes (operation, agent and tool names, finish reasons, usage, an
approval marker, exception types). Every other attribute — prompts, messages, tool
arguments and results, anything a runtime adds — is skipped unread (in JSON it is
not even parsed), so no content can reach an event.

A message that is not TracesData is refused whole: :class:`BadTraces` names the
reason (a bounded code, for the dead-letter header and the metric). A span that
cannot be trusted (an id, its times, a mapped attribute of the wrong type) costs
that span only: given a ``refused`` list, the decoders record it there as a
:class:`Refused` and put a placeholder in its place (``Span.lost``: its ids and role,
which place the loss on its run) instead of refusing the message. Errors name a
mapped attribute's value only when it is a scalar; no other value is ever quoted.
"""

from __future__ import annotations

from typing import Any

import msgspec

from loopwarden.codecs.events import CAUSES, Policy
from loopwarden.stages.otel.mapping import (
    BY_SCOPE,
    ROLE_MARK,
    ROLE_MODEL,
    ROLE_OTHER,
    ROLE_RUN,
    ROLE_TOOL,
    Runtime,
    classify,
    select_runtime,
    thread_run_id,
)

MAX_NAME = 200  # names (agent, tool, span) are cut to the wire types' bound
MAX_SPANS_PER_MESSAGE = 1_000_000  # bounded by the message size anyway; a guard for JSON

STATUS_ERROR = 2

# Attributes read, and the type each must have. Anything else is never read.
STR = "str"
INT = "int"
STRS = "strs"  # a string array (a lone string accepted: runtimes differ)
JSONTEXT = "json"  # a JSON object as text, read for a few keys; anything else is ignored, not refused
# The producer hook's attributes (docs/opentelemetry.md, "The hook's attributes"): a value of the wrong type
# costs that attribute only (it reads as BAD, counted on its span), never the span or its message.
HOOK_STR = "hook_str"
HOOK_INT = "hook_int"
HOOK_STRS = "hook_strs"
HOOK_KINDS = (HOOK_STR, HOOK_INT, HOOK_STRS)
PRESENT = "present"  # read for its presence only: a model call's response attributes (never its value)
KNOWN: dict[str, str] = {
    "gen_ai.operation.name": STR,
    "gen_ai.agent.name": STR,
    "gen_ai.response.finish_reasons": STRS,
    "gen_ai.usage.input_tokens": INT,
    "gen_ai.usage.output_tokens": INT,
    "gen_ai.tool.name": STR,
    "gen_ai.tool.call.id": STR,
    "error.type": STR,
    # AI SDK <= 6 (ai.*)
    "ai.operationId": STR,
    "ai.telemetry.functionId": STR,  # the agent's name in AI SDK <= 6 telemetry
    "ai.response.finishReason": STR,
    "ai.usage.promptTokens": INT,
    "ai.usage.completionTokens": INT,
    "ai.usage.inputTokens": INT,
    "ai.usage.outputTokens": INT,
    "ai.usage.totalTokens": INT,
    "ai.toolCall.name": STR,
    "ai.toolCall.id": STR,
    # OpenInference
    "openinference.span.kind": STR,
    "llm.token_count.prompt": INT,
    "llm.token_count.completion": INT,
    "llm.token_count.total": INT,
    "llm.finish_reason": STR,
    "tool.name": STR,
    "tool_call.id": STR,
    "metadata": JSONTEXT,  # LangChain run metadata: only which LangGraph node a span is (never copied)
    # Pydantic AI
    "pydantic_ai.tool.deferral.name": STR,
    # a model call that got a response says so (with the finish reasons and usage above): a call cut short
    # (cancelled, hung) has none of them
    "gen_ai.response.model": PRESENT,
    "gen_ai.response.id": PRESENT,
    # the producer hook (loopwarden.stages.otel.hook, or set by hand), on any runtime
    "loopwarden.run.id": HOOK_STR,
    "loopwarden.agent": HOOK_STR,
    "loopwarden.marker": HOOK_STR,
    "loopwarden.stop.cause": HOOK_STR,
    "loopwarden.stop.fired": HOOK_STRS,
    "loopwarden.policy": HOOK_STR,
    "loopwarden.job.id": HOOK_STR,
    "loopwarden.attempt": HOOK_INT,
    "loopwarden.recovers": HOOK_STR,
    "loopwarden.approval.id": HOOK_STR,
    "loopwarden.approval.tool_call_id": HOOK_STR,
    "loopwarden.approval.tool_name": HOOK_STR,
    "loopwarden.approval.owner": HOOK_STR,
    "loopwarden.approval.deadline_ts": HOOK_INT,
    "loopwarden.approval.resume_token": HOOK_STR,
}
BAD = object()  # a hook attribute whose value had the wrong type
_INPUT_KEYS = ("gen_ai.usage.input_tokens", "ai.usage.inputTokens", "ai.usage.promptTokens", "llm.token_count.prompt")
_OUTPUT_KEYS = ("gen_ai.usage.output_tokens", "ai.usage.outputTokens", "ai.usage.completionTokens",
                "llm.token_count.completion")
_TOTAL_KEYS = ("ai.usage.totalTokens", "llm.token_count.total")
_OTHER_USAGE_KEYS = frozenset(_INPUT_KEYS[1:] + _OUTPUT_KEYS[1:] + _TOTAL_KEYS)
_TOOL_NAME_KEYS = ("gen_ai.tool.name", "ai.toolCall.name", "tool.name")
_TOOL_ID_KEYS = ("gen_ai.tool.call.id", "ai.toolCall.id", "tool_call.id")
MAX_TOKENS = 2**53 - 1
ZERO8 = bytes(8)


class BadTraces(ValueError):
    """A message the bridge refuses; ``reason`` is a bounded code."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class Hook(msgspec.Struct, array_like=True, frozen=True, gc=False):
    """The producer hook's attributes on one span, checked (docs/opentelemetry.md, "The hook's attributes").

    Each refused value is left out and counted in ``bad``: the run it belongs to cannot be trusted to
    say why it stopped, and ends ``unknown``; the span and its message are kept."""

    run_id: str = ""  # loopwarden.run.id: the application's run id
    cause: str = ""  # loopwarden.stop.cause: a run_ended cause
    fired: tuple[str, ...] = ()  # loopwarden.stop.fired
    policy: Policy | None = None  # loopwarden.policy, decoded
    approval_id: str = ""  # loopwarden.approval.*: on the tool span that asked for approval, or on the run span
    owner: str = ""
    deadline_ts: int | None = None
    resume_token: str = ""
    bad: int = 0  # hook attributes refused on this span (wrong type, bad JSON, out of bounds)
    # loopwarden.approval.tool_call_id / .tool_name: the call awaiting approval, named on the run span when the
    # approval came to light after its tool span ended (or when it has none)
    approval_tool_call_id: str = ""
    approval_tool_name: str = ""
    agent: str = ""  # loopwarden.agent: the agent's name, the producer's word over the runtime's
    marker: str = ""  # loopwarden.marker: "run_start" on the hook's start marker (a child of the run span)


_policy_json = msgspec.json.Decoder(Policy)
RUN_START = "run_start"  # the only loopwarden.marker
_HOOK_KEYS = frozenset(k for k, kind in KNOWN.items() if kind in HOOK_KINDS)


def _hook(attrs: dict[str, Any]) -> Hook:
    """The hook attributes of a span (it has some), each checked against the contract's bounds."""
    get = attrs.get
    bad = 0

    def text(key: str, cap: int) -> str:
        nonlocal bad
        v = get(key)
        if v is None:
            return ""
        if v is BAD or not v or len(v) > cap:
            bad += 1
            return ""
        return v

    run_id = text("loopwarden.run.id", 200)
    cause = text("loopwarden.stop.cause", 40)
    if cause and cause not in CAUSES:
        bad, cause = bad + 1, ""
    fired = get("loopwarden.stop.fired") or ()
    if fired is BAD or len(fired) > 200 or not all(0 < len(f) <= 300 for f in fired):
        bad, fired = bad + 1, ()
    policy = None
    raw = text("loopwarden.policy", 65536)
    if raw:
        try:
            policy = _policy_json.decode(raw)
        except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
            bad += 1
    text("loopwarden.job.id", 200)  # the contract's jobs (section 12): checked, not carried by these events
    text("loopwarden.recovers", 200)
    attempt = get("loopwarden.attempt")
    if attempt is BAD or (attempt is not None and attempt < 1):
        bad += 1
    approval_id = text("loopwarden.approval.id", 200)
    owner = text("loopwarden.approval.owner", 200)
    resume_token = text("loopwarden.approval.resume_token", 1000)
    deadline_ts = get("loopwarden.approval.deadline_ts")
    if deadline_ts is BAD:
        bad, deadline_ts = bad + 1, None
    tool_call_id = text("loopwarden.approval.tool_call_id", 200)
    tool_name = text("loopwarden.approval.tool_name", MAX_NAME)
    agent = text("loopwarden.agent", 100)  # run_started.agent's bound
    marker = text("loopwarden.marker", 40)
    if marker and marker != RUN_START:
        bad, marker = bad + 1, ""
    return Hook(run_id, cause, tuple(fired), policy, approval_id, owner, deadline_ts, resume_token, bad,
                tool_call_id, tool_name, agent, marker)


class Span(msgspec.Struct, array_like=True, frozen=True, gc=False):
    """One span, content-free: what the fold needs and nothing else (times in ns)."""

    trace_id: str  # 32 lowercase hex
    span_id: str  # 16 lowercase hex
    parent_id: str  # "" for a root span
    role: int  # mapping.ROLE_*
    runtime: int  # index of its row in mapping.RUNTIMES
    start_ns: int
    end_ns: int
    error: bool  # status ERROR
    name: str = ""  # the span name (run spans: the agent name's fallback)
    agent: str = ""  # gen_ai.agent.name
    scope: str = ""  # "<scope name>@<scope version>"
    finish: str = ""  # the first finish reason, as the runtime wrote it
    input_tokens: int | None = None
    output_tokens: int | None = None
    total_tokens: int | None = None
    tool_name: str = ""
    tool_id: str = ""
    approval: bool = False  # the runtime marked this tool call as deferred for approval
    exceptions: tuple[str, ...] = ()  # exception types recorded on the span (error.type first)
    # The reason the decoder refused the span ("": a sound span). A refused span is a placeholder: it
    # links its children and tells its run of the loss, and is never a step or a tool call.
    lost: str = ""
    # a model call with no response attribute at all (finish reasons, usage, response model or id) and no
    # error: it never completed (cancelled, or cut short), so it is never a natural finish
    incomplete: bool = False
    hook: Hook | None = None  # the producer hook's attributes, when the span has any


class Refused(msgspec.Struct, frozen=True, gc=False):
    """A span the decoder could not trust: where it was and why ("" for an id it could not read)."""

    trace_id: str
    span_id: str
    parent_id: str
    reason: str  # a bounded code, as BadTraces.reason
    error: str


def _cut(text: str) -> str:
    return text if len(text) <= MAX_NAME else text[:MAX_NAME]


def _hex_id(raw: bytes, size: int, what: str, where: str, allow_empty: bool = False) -> str:
    if not raw:
        if allow_empty:
            return ""
        raise BadTraces("bad_span_id", f"{what} missing ({where})")
    if len(raw) != size or not any(raw):
        raise BadTraces("bad_span_id", f"{what} {raw.hex()[:80]!r} is not {size} bytes, non-zero ({where})")
    return raw.hex()


def _check_hex(text: Any, size: int, what: str, where: str, allow_empty: bool = False) -> str:
    if text is None or text == "":
        if allow_empty:
            return ""
        raise BadTraces("bad_span_id", f"{what} missing ({where})")
    if not isinstance(text, str) or len(text) != 2 * size:
        raise BadTraces("bad_span_id", f"{what} {str(text)[:80]!r} is not {2 * size} hex characters ({where})")
    try:
        raw = bytes.fromhex(text)
    except ValueError:
        raise BadTraces("bad_span_id", f"{what} {text[:80]!r} is not hex ({where})") from None
    if not any(raw):
        raise BadTraces("bad_span_id", f"{what} {text!r} is all zero ({where})")
    return text.lower()


def _wrong(key: str, want: str, got: Any, where: str) -> BadTraces:
    # A mapped attribute's scalar is shown (a token count sent as a string); a container only by its type,
    # since what it holds was never read.
    if isinstance(got, (str, int, float, bool)):
        shown = repr(got)
        shown = shown if len(shown) <= 80 else shown[:77] + "..."
    else:
        shown = f"a {type(got).__name__}"
    return BadTraces("bad_attribute", f"attribute {key!r} must be {want}, got {shown} ({where})")


def _checked(key: str, kind: str, value: Any, where: str) -> Any:
    """A mapped attribute's value checked against its type (``value`` already a Python value)."""
    if kind == STR:
        if not isinstance(value, str):
            raise _wrong(key, "a string", value, where)
        return value
    if kind == JSONTEXT:
        return value if isinstance(value, str) else None
    if kind == PRESENT:
        return True
    if kind in HOOK_KINDS:
        return _hook_value(kind, value)
    if kind == INT:
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_TOKENS:
            raise _wrong(key, "an int >= 0", value, where)
        return value
    if isinstance(value, str):
        return (value,)
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        raise _wrong(key, "a string array", value, where)
    return tuple(value)


def _hook_value(kind: str, value: Any) -> Any:
    """A hook attribute's value, or BAD (never an exception: it costs the attribute, not the span)."""
    if kind == HOOK_STR:
        return value if isinstance(value, str) else BAD
    if kind == HOOK_INT:
        ok = isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_TOKENS
        return value if ok else BAD
    if isinstance(value, str):
        return (value,)
    if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        return tuple(value)
    return BAD


def _build(trace_id: str, span_id: str, parent_id: str, name: str, start_ns: int, end_ns: int, status: int,
           attrs: dict[str, Any], exceptions: list[str] | tuple[()], scope: str, scope_name: str, status_message: str,
           found: tuple[int, Runtime] | None = None) -> Span:
    """The :class:`Span` of one decoded span; ``found``: its row when the scope alone chose it (once per scope)."""
    if start_ns <= 0 or end_ns < start_ns:
        raise BadTraces("bad_span_time", f"span times start={start_ns} end={end_ns} are not a span "
                                         f"(span {span_id} of trace {trace_id})")
    runtime_index, runtime = found if found is not None else select_runtime(scope_name, name, attrs)
    role = classify(runtime, name, attrs)
    get = attrs.get
    hook = None if _HOOK_KEYS.isdisjoint(attrs) else _hook(attrs)
    if hook is not None and hook.marker:
        role = ROLE_MARK
    if runtime.thread_metadata and role != ROLE_OTHER and (hook is None or not hook.run_id):
        thread = thread_run_id(runtime, get("metadata"))
        if thread:  # the runtime's own run id across traces, below the producer's
            hook = msgspec.structs.replace(hook, run_id=thread) if hook is not None else Hook(run_id=thread)
    reasons = get("gen_ai.response.finish_reasons")
    finish = reasons[0] if reasons else (get("ai.response.finishReason") or get("llm.finish_reason") or "")
    err_type = get("error.type")
    excs = [err_type, *exceptions] if err_type else exceptions
    error = status == STATUS_ERROR
    if error and runtime.status_exceptions and status_message:
        excs = [*excs, *(exc for prefix, exc in runtime.status_exceptions if status_message.startswith(prefix))]
    agent = get("gen_ai.agent.name") or get("ai.telemetry.functionId") or ""
    if agent and runtime.agent_on_run_only and role != ROLE_RUN:
        agent = ""
    if hook is not None and hook.agent:
        agent = hook.agent
    tool_name = tool_id = ""
    if role == ROLE_TOOL:
        tool_name = get("gen_ai.tool.name") or get("ai.toolCall.name") or get("tool.name") or ""
        if not tool_name and runtime.handoff_tools:
            op = get("gen_ai.operation.name")
            tool_name = op if op in runtime.handoff_tools else ""
        tool_id = get("gen_ai.tool.call.id") or get("ai.toolCall.id") or get("tool_call.id") or ""
    # The first key present of each usage list; on a span with none of the other runtimes' usage keys that
    # is GenAI's (one look-up each).
    if _OTHER_USAGE_KEYS.isdisjoint(attrs):
        input_tokens, output_tokens, total_tokens = get(_INPUT_KEYS[0]), get(_OUTPUT_KEYS[0]), None
    else:
        input_tokens = _first(attrs, _INPUT_KEYS)
        output_tokens = _first(attrs, _OUTPUT_KEYS)
        total_tokens = _first(attrs, _TOTAL_KEYS)
    return Span(
        trace_id, span_id, parent_id, role, runtime_index, start_ns, end_ns, error,
        name[:MAX_NAME] if role == ROLE_RUN or (role == ROLE_OTHER and runtime.wrapper_parent_is_run
                                                and get("openinference.span.kind") in runtime.run_kinds) else "",
        agent[:MAX_NAME],
        scope[:MAX_NAME] if role != ROLE_OTHER else "",
        finish[:MAX_NAME],
        input_tokens, output_tokens, total_tokens,
        tool_name[:MAX_NAME], tool_id[:MAX_NAME],
        _approval(runtime, attrs, excs) if ((role == ROLE_TOOL and (runtime.approval_attrs or "loopwarden.approval.id" in attrs))
                                            or excs) else False,
        tuple(e[:MAX_NAME] for e in excs[:8]) if excs else (),
        "",  # lost: a sound span
        role == ROLE_MODEL and not (finish or error or input_tokens is not None or output_tokens is not None
                                    or total_tokens is not None or "gen_ai.response.model" in attrs
                                    or "gen_ai.response.id" in attrs),
        hook,
    )


def _first(attrs: dict[str, Any], keys: tuple[str, ...]) -> Any:
    for key in keys:
        if key in attrs:
            return attrs[key]
    return None


def _approval(runtime: Runtime, attrs: dict[str, Any], exceptions: list[str] | tuple[()]) -> bool:
    marked = attrs.get("loopwarden.approval.id")
    if marked and marked is not BAD:
        return True
    for key, value in runtime.approval_attrs:
        if attrs.get(key) == value:
            return True
    return bool(exceptions) and any(_short(e) in runtime.approval_exceptions for e in exceptions)


def _short(exc_type: str) -> str:
    """``pydantic_ai.exceptions.UsageLimitExceeded`` -> ``UsageLimitExceeded``."""
    return exc_type.rsplit(".", 1)[-1]


# -- protobuf (otlp_proto) -------------------------------------------------------------
def _proto_value(v) -> Any:
    which = v.WhichOneof("value")
    if which == "string_value":
        return v.string_value
    if which == "int_value":
        return v.int_value
    if which == "bool_value":
        return v.bool_value
    if which == "double_value":
        return v.double_value
    if which == "array_value":
        return [_proto_value(x) for x in v.array_value.values]
    if which == "bytes_value":
        return bytes(v.bytes_value)
    if which == "kvlist_value":
        return {"kvlist": len(v.kvlist_value.values)}
    return None


_proto: list = []  # (TracesData.FromString, DecodeError), imported at the first protobuf message


def _parse_proto(data: bytes):
    if not _proto:
        from google.protobuf.message import DecodeError
        from opentelemetry.proto.trace.v1.trace_pb2 import TracesData

        _proto[:] = (TracesData.FromString, DecodeError)
    parse, decode_error = _proto
    try:
        return parse(data)
    except (decode_error, RecursionError, ValueError) as exc:
        raise BadTraces("not_traces_data", f"not an OTLP TracesData protobuf: {exc}") from None


def _proto_ids(sp, hex_ids: dict[bytes, str]) -> tuple[str, str, str]:
    """(trace id, span id, parent id) in hex, checked; ``hex_ids`` caches the message's few trace ids."""
    raw_tid = sp.trace_id
    trace_id = hex_ids.get(raw_tid)
    if trace_id is None:
        trace_id = hex_ids[raw_tid] = _hex_id(raw_tid, 16, "trace id", f"span {sp.span_id.hex()[:32]!r}")
    raw = sp.span_id
    if len(raw) == 8 and raw != ZERO8:
        span_id = raw.hex()
    else:
        span_id = _hex_id(raw, 8, "span id", f"trace {trace_id}")
    raw = sp.parent_span_id
    if not raw:
        parent_id = ""
    elif len(raw) == 8 and raw != ZERO8:
        parent_id = raw.hex()
    else:
        parent_id = _hex_id(raw, 8, "parent span id", f"span {span_id} of trace {trace_id}")
    return trace_id, span_id, parent_id


def decode_proto(data: bytes, refused: list[Refused] | None = None) -> list[Span]:
    """The hot path (docs/opentelemetry.md, "Performance"): each upb field read costs ~0.1-0.2 us, so only
    the mapped attributes' values are read, the common types inline (a nonzero ``string_value`` or
    ``int_value`` is the one the oneof holds), the row of a known scope chosen once per ScopeSpans, the
    status message read only on an ERROR span. :func:`decode_proto_reference` is the plain version;
    tests/unit/test_otel_bridge.py checks that both agree on generated messages. ``refused``: see the module."""
    traces = _parse_proto(data)
    out: list[Span] = []
    append = out.append
    known = KNOWN
    by_scope = BY_SCOPE
    hex_ids: dict[bytes, str] = {}  # a message holds few traces: each trace id converted once
    for rs in traces.resource_spans:
        for ss in rs.scope_spans:
            sc = ss.scope
            scope_name, version = sc.name, sc.version
            scope = f"{scope_name}@{version}" if version else scope_name
            found = by_scope.get(scope_name)  # the row of every span of the scope, or None: chosen per span
            for sp in ss.spans:
                try:
                    raw_tid = sp.trace_id
                    trace_id = hex_ids.get(raw_tid)
                    raw = sp.span_id
                    if trace_id is not None and len(raw) == 8 and raw != ZERO8:
                        span_id = raw.hex()
                        raw = sp.parent_span_id
                        if not raw:
                            parent_id = ""
                        elif len(raw) == 8 and raw != ZERO8:
                            parent_id = raw.hex()
                        else:
                            parent_id = _hex_id(raw, 8, "parent span id", f"span {span_id} of trace {trace_id}")
                    else:
                        trace_id, span_id, parent_id = _proto_ids(sp, hex_ids)
                    attrs: dict[str, Any] = {}
                    for kv in sp.attributes:
                        key = kv.key
                        kind = known.get(key)
                        if kind is None:
                            continue  # never read: content, or nothing a row maps
                        v = kv.value
                        if kind is STR:
                            x = v.string_value
                            if x or v.WhichOneof("value") == "string_value":
                                attrs[key] = x
                                continue
                        elif kind is INT:
                            x = v.int_value
                            if 0 < x <= MAX_TOKENS:
                                attrs[key] = x
                                continue
                        attrs[key] = _proto_checked(key, kind, v, span_id, trace_id)
                    exceptions: list[str] | tuple[()] = ()
                    if sp.events:
                        exceptions = []
                        for ev in sp.events:
                            if ev.name == "exception":
                                for kv in ev.attributes:
                                    if kv.key == "exception.type":
                                        exceptions.append(
                                            _proto_checked("exception.type", STR, kv.value, span_id, trace_id))
                    status = sp.status
                    code = status.code
                    append(_build(trace_id, span_id, parent_id, sp.name, sp.start_time_unix_nano, sp.end_time_unix_nano,
                                  code, attrs, exceptions, scope, scope_name,
                                  status.message if code == STATUS_ERROR else "", found))
                except BadTraces as exc:
                    if refused is None:
                        raise
                    _refuse_proto(sp, scope, scope_name, exc, out, refused)
    return out


def decode_proto_reference(data: bytes) -> list[Span]:
    """:func:`decode_proto` written plainly (every mapped attribute converted, then checked; the row chosen
    per span): what the fast path must agree with, span for span and error for error."""
    traces = _parse_proto(data)
    out: list[Span] = []
    hex_ids: dict[bytes, str] = {}
    for rs in traces.resource_spans:
        for ss in rs.scope_spans:
            scope_name = ss.scope.name
            scope = f"{scope_name}@{ss.scope.version}" if ss.scope.version else scope_name
            for sp in ss.spans:
                trace_id, span_id, parent_id = _proto_ids(sp, hex_ids)
                where = f"span {span_id} of trace {trace_id}"
                attrs = {kv.key: _checked(kv.key, KNOWN[kv.key], _proto_value(kv.value), where)
                         for kv in sp.attributes if kv.key in KNOWN}
                exceptions = [_checked("exception.type", STR, _proto_value(kv.value), where)
                              for ev in sp.events if ev.name == "exception"
                              for kv in ev.attributes if kv.key == "exception.type"]
                out.append(_build(trace_id, span_id, parent_id, sp.name, sp.start_time_unix_nano,
                                  sp.end_time_unix_nano, sp.status.code, attrs, exceptions, scope, scope_name,
                                  sp.status.message))
    return out


def _refuse_proto(sp, scope: str, scope_name: str, exc: BadTraces, out: list[Span], refused: list[Refused]) -> None:
    """A protobuf span the fast path refused: recorded, and its placeholder added when its ids are readable."""
    raw_tid, raw_sid, raw_pid = sp.trace_id, sp.span_id, sp.parent_span_id
    trace_id = raw_tid.hex() if len(raw_tid) == 16 else ""
    span_id = raw_sid.hex() if len(raw_sid) == 8 else ""
    parent_id = raw_pid.hex() if len(raw_pid) == 8 else ""
    refused.append(Refused(trace_id, span_id, parent_id, exc.reason, str(exc)))
    try:
        ids = _proto_ids(sp, {})
    except BadTraces:
        return  # no run to tell: the loss is counted only
    message = sp.status.message if sp.status.code == STATUS_ERROR else ""
    out.append(_placeholder(sp, _proto_value, ids, sp.start_time_unix_nano, sp.end_time_unix_nano, message,
                            scope, scope_name, exc.reason))


def _placeholder(sp: Any, value_of: Any, ids: tuple[str, str, str], start_ns: int, end_ns: int,
                 status_message: str, scope: str, scope_name: str, reason: str) -> Span:
    """A refused span's placeholder (``sp`` a protobuf or an OTLP/JSON span, ``value_of`` its attribute value
    reader): what could be read of it, ``lost`` = why it was refused. Its mapped attributes that pass their
    check are kept (the one that refused the span is not). Times that are no span's become its latest one
    (the task moves a time still ahead of its clock back to it)."""
    attrs = {}
    for kv in sp.attributes:
        kind = KNOWN.get(kv.key)
        if kind is not None:
            try:
                attrs[kv.key] = _checked(kv.key, kind, value_of(kv.value), "")
            except BadTraces:
                pass  # the attribute that refused the span
    exceptions = [x for ev in sp.events if ev.name == "exception" for kv in ev.attributes
                  if kv.key == "exception.type" and isinstance(x := value_of(kv.value), str)]
    if start_ns <= 0 or end_ns < start_ns:
        start_ns = end_ns = max(start_ns, end_ns, 1)
    span = _build(*ids, sp.name, start_ns, end_ns, sp.status.code, attrs, exceptions, scope, scope_name,
                  status_message)
    return msgspec.structs.replace(span, lost=reason)


def _proto_checked(key: str, kind: str, v, span_id: str, trace_id: str) -> Any:
    """A mapped attribute's protobuf AnyValue, checked against its type without converting anything else."""
    which = v.WhichOneof("value")
    if kind == STR:
        if which == "string_value":
            return v.string_value
    elif kind == INT:
        if which == "int_value" and 0 <= v.int_value <= MAX_TOKENS:
            return v.int_value
    elif kind == STRS:
        if which == "string_value":
            return (v.string_value,)
        if which == "array_value":
            values = v.array_value.values
            if len(values) == 1 and values[0].WhichOneof("value") == "string_value":
                return (values[0].string_value,)  # finish reasons: one, nearly always
            if all(x.WhichOneof("value") == "string_value" for x in values):
                return tuple(x.string_value for x in values)
    elif kind == PRESENT:
        return True
    elif kind in HOOK_KINDS:
        return _hook_value(kind, _proto_value(v))
    else:  # JSONTEXT: read when text, ignored otherwise
        return v.string_value if which == "string_value" else None
    return _checked(key, kind, _proto_value(v), f"span {span_id} of trace {trace_id}")  # raises, naming the value


# -- OTLP/JSON (otlp_json) ---------------------------------------------------------------
# Attribute values stay raw bytes (msgspec.Raw) until a key is known to be mapped: content
# attributes are never parsed.
class _KV(msgspec.Struct):
    key: str = ""
    value: msgspec.Raw = msgspec.Raw(b"{}")


class _Event(msgspec.Struct, rename="camel"):
    name: str = ""
    attributes: list[_KV] = []


class _Status(msgspec.Struct):
    code: int = 0
    message: str = ""


class _JSpan(msgspec.Struct, rename="camel"):
    trace_id: str | None = None
    span_id: str | None = None
    parent_span_id: str | None = None
    name: str = ""
    start_time_unix_nano: int | str = 0
    end_time_unix_nano: int | str = 0
    attributes: list[_KV] = []
    events: list[_Event] = []
    status: _Status = msgspec.field(default_factory=_Status)


class _Scope(msgspec.Struct):
    name: str = ""
    version: str = ""


class _ScopeSpans(msgspec.Struct, rename="camel"):
    scope: _Scope = msgspec.field(default_factory=_Scope)
    spans: list[_JSpan] = []


class _ResourceSpans(msgspec.Struct, rename="camel"):
    scope_spans: list[_ScopeSpans] = []


class _TracesData(msgspec.Struct, rename="camel"):
    resource_spans: list[_ResourceSpans]


_json_traces = msgspec.json.Decoder(_TracesData)
_json_any = msgspec.json.Decoder()


def _json_value(raw: msgspec.Raw) -> Any:
    """An OTLP/JSON AnyValue (``{"stringValue": ...}``, ``{"intValue": "12"}``, ...) as a Python value."""
    try:
        v = _json_any.decode(raw)
    except (msgspec.DecodeError, RecursionError):
        return None
    return _any(v)


def _any(v: Any) -> Any:
    if not isinstance(v, dict) or len(v) != 1:
        return v
    (kind, x), = v.items()
    if kind == "stringValue":
        return x
    if kind == "intValue":
        if isinstance(x, str):
            try:
                return int(x)
            except ValueError:
                return x
        return x
    if kind in ("boolValue", "doubleValue"):
        return x
    if kind == "arrayValue":
        return [_any(e) for e in (x or {}).get("values", [])] if isinstance(x, dict) else x
    return x


def _nanos(value: int | str, where: str) -> int:
    if isinstance(value, int):
        return value
    try:
        return int(value)
    except ValueError:
        raise BadTraces("bad_span_time", f"span time {value[:40]!r} is not an integer ({where})") from None


def decode_json(data: bytes, refused: list[Refused] | None = None) -> list[Span]:
    try:
        traces = _json_traces.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError) as exc:
        raise BadTraces("not_traces_data", f"not OTLP/JSON TracesData: {exc}") from None
    out: list[Span] = []
    known = KNOWN
    for rs in traces.resource_spans:
        for ss in rs.scope_spans:
            scope_name = ss.scope.name
            scope = f"{scope_name}@{ss.scope.version}" if ss.scope.version else scope_name
            for sp in ss.spans:
                try:
                    trace_id = _check_hex(sp.trace_id, 16, "trace id", f"span {str(sp.span_id)[:32]!r}")
                    span_id = _check_hex(sp.span_id, 8, "span id", f"trace {trace_id}")
                    where = f"span {span_id} of trace {trace_id}"
                    parent_id = _check_hex(sp.parent_span_id, 8, "parent span id", where, allow_empty=True)
                    attrs: dict[str, Any] = {}
                    for kv in sp.attributes:
                        kind = known.get(kv.key)
                        if kind is not None:
                            attrs[kv.key] = _checked(kv.key, kind, _json_value(kv.value), where)
                    exceptions = [
                        _checked("exception.type", STR, _json_value(kv.value), where)
                        for ev in sp.events if ev.name == "exception"
                        for kv in ev.attributes if kv.key == "exception.type"
                    ]
                    out.append(_build(trace_id, span_id, parent_id, sp.name, _nanos(sp.start_time_unix_nano, where),
                                      _nanos(sp.end_time_unix_nano, where), sp.status.code, attrs, exceptions,
                                      scope, scope_name, sp.status.message))
                except BadTraces as exc:
                    if refused is None:
                        raise
                    _refuse_json(sp, scope, scope_name, exc, out, refused)
                if len(out) > MAX_SPANS_PER_MESSAGE:
                    raise BadTraces("oversized", f"more than {MAX_SPANS_PER_MESSAGE} spans in one message")
    return out


def _refuse_json(sp: _JSpan, scope: str, scope_name: str, exc: BadTraces, out: list[Span],
                 refused: list[Refused]) -> None:
    """An OTLP/JSON span refused: recorded, and its placeholder added when its ids and times are readable."""
    def readable(text: Any, size: int) -> str:
        try:
            return _check_hex(text, size, "", "", allow_empty=True)
        except BadTraces:
            return ""

    trace_id, span_id, parent_id = readable(sp.trace_id, 16), readable(sp.span_id, 8), readable(sp.parent_span_id, 8)
    refused.append(Refused(trace_id, span_id, parent_id, exc.reason, str(exc)))
    if not trace_id or not span_id or (sp.parent_span_id and not parent_id):
        return  # no run to tell: the loss is counted only
    try:
        start_ns, end_ns = _nanos(sp.start_time_unix_nano, ""), _nanos(sp.end_time_unix_nano, "")
    except BadTraces:
        return
    out.append(_placeholder(sp, _json_value, (trace_id, span_id, parent_id), start_ns, end_ns, sp.status.message,
                            scope, scope_name, exc.reason))


PROTO = "application/x-protobuf"
JSON = "application/json"


def decode_traces(data: bytes, content_type: str | None = None, refused: list[Refused] | None = None) -> list[Span]:
    """The spans of one ``otlp_spans`` message, content-free; :class:`BadTraces` if it is not TracesData.

    ``content_type``: the message's ``content-type`` header when present; without one, a message
    starting with ``{`` is OTLP/JSON (a TracesData protobuf starts with field 1's tag, 0x0a).
    ``refused``: where a span that cannot be trusted goes (with a placeholder among the spans) instead
    of refusing the message."""
    if not data:
        raise BadTraces("not_traces_data", "empty message")
    if is_json(data, content_type):
        return decode_json(data, refused)
    return decode_proto(data, refused)


def is_json(data: bytes, content_type: str | None) -> bool:
    """Whether a message is OTLP/JSON (else protobuf): its content-type header, else its first byte."""
    if content_type is not None:
        return "json" in content_type.lower()
    return data.lstrip(b" \t\r")[:1] == b"{"  # protobuf's first byte is 0x0a ("\n")
