"""Build TracesData by hand (opentelemetry-proto), for the bridge's unit tests."""

from __future__ import annotations

import itertools

from opentelemetry.proto.common.v1.common_pb2 import AnyValue, ArrayValue, InstrumentationScope, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span, Status, TracesData

SECRET = "s3cr3t-PLANTED-0xC0FFEE"
_ids = itertools.count(1)
T0 = 1_790_000_000_000_000_000  # ns


def trace_id(n: int | None = None) -> bytes:
    return (n if n is not None else next(_ids)).to_bytes(16, "big")


def span_id() -> bytes:
    return next(_ids).to_bytes(8, "big")


def value(v) -> AnyValue:
    if isinstance(v, bool):
        return AnyValue(bool_value=v)
    if isinstance(v, int):
        return AnyValue(int_value=v)
    if isinstance(v, float):
        return AnyValue(double_value=v)
    if isinstance(v, (list, tuple)):
        return AnyValue(array_value=ArrayValue(values=[value(x) for x in v]))
    return AnyValue(string_value=v)


def span(tid: bytes, name: str, start_ms: int, end_ms: int, *, parent: bytes = b"", sid: bytes | None = None,
         error: bool = False, exception: str | None = None, **attrs) -> Span:
    s = Span(trace_id=tid, span_id=sid or span_id(), parent_span_id=parent, name=name,
             start_time_unix_nano=T0 + start_ms * 1_000_000, end_time_unix_nano=T0 + end_ms * 1_000_000,
             status=Status(code=Status.STATUS_CODE_ERROR if error else Status.STATUS_CODE_UNSET))
    for key, v in attrs.items():
        s.attributes.append(KeyValue(key=key.replace("__", "."), value=value(v)))
    if exception:
        ev = s.events.add(name="exception", time_unix_nano=s.end_time_unix_nano)
        ev.attributes.append(KeyValue(key="exception.type", value=value(exception)))
        ev.attributes.append(KeyValue(key="exception.message", value=value(SECRET)))
    return s


def ai_sdk_7_run(agent: str = "weather") -> tuple[bytes, bytes, list[Span]]:
    """An AI SDK 7 run (``invoke_agent`` > ``step N`` > ``chat``, ``execute_tool``) of two steps, the first
    calling ``lookup``: (trace id, run span id, its spans as they end: chat, tool, step 1, chat, step 2, run)."""
    tid, root = trace_id(), span_id()
    w1, w2 = span_id(), span_id()
    g = {"gen_ai__operation__name": "chat"}
    return tid, root, [
        span(tid, "chat mock", 1, 10, parent=w1, gen_ai__response__finish_reasons=["tool-calls"], **g),
        span(tid, "execute_tool lookup", 11, 15, parent=w1, gen_ai__operation__name="execute_tool",
             gen_ai__tool__name="lookup", gen_ai__tool__call__id="call-1"),
        span(tid, "step 1", 1, 16, sid=w1, parent=root, gen_ai__operation__name="agent_step"),
        span(tid, "chat mock", 17, 20, parent=w2, gen_ai__response__finish_reasons=["stop"], **g),
        span(tid, "step 2", 17, 21, sid=w2, parent=root, gen_ai__operation__name="agent_step"),
        span(tid, "invoke_agent mock", 0, 22, sid=root, gen_ai__operation__name="invoke_agent",
             gen_ai__agent__name=agent, gen_ai__response__finish_reasons=["stop"]),
    ]


def traces(*spans: Span, scope: str = "pydantic-ai", version: str = "2.68.0") -> bytes:
    return TracesData(resource_spans=[ResourceSpans(scope_spans=[ScopeSpans(
        scope=InstrumentationScope(name=scope, version=version), spans=list(spans))])]).SerializeToString()


class Run:
    """A GenAI-conventions run: invoke_agent > chat, execute_tool; children made before the run span."""

    def __init__(self, agent: str = "agent", tid: bytes | None = None, start_ms: int = 0) -> None:
        self.tid = tid or trace_id()
        self.sid = span_id()
        self.agent = agent
        self.start_ms = start_ms
        self.t = start_ms

    def chat(self, finish: str | None = "tool_calls", dur: int = 10, **kw) -> Span:
        attrs = {"gen_ai__operation__name": "chat", "gen_ai__agent__name": self.agent,
                 "gen_ai__usage__input_tokens": 10, "gen_ai__usage__output_tokens": 5,
                 "gen_ai__input__messages": SECRET, "gen_ai__output__messages": SECRET}
        if finish is not None:
            attrs["gen_ai__response__finish_reasons"] = [finish]
        attrs.update(kw)
        s = span(self.tid, "chat model", self.t + 1, self.t + dur, parent=self.sid, **attrs)
        self.t += dur
        return s

    def tool(self, name: str = "lookup", dur: int = 5, error: bool = False, exception: str | None = None,
             **kw) -> Span:
        attrs = {"gen_ai__operation__name": "execute_tool", "gen_ai__tool__name": name,
                 "gen_ai__tool__call__id": f"call-{next(_ids)}", "gen_ai__tool__call__arguments": SECRET,
                 "gen_ai__tool__call__result": SECRET}
        attrs.update(kw)
        s = span(self.tid, f"execute_tool {name}", self.t + 1, self.t + dur, parent=self.sid, error=error,
                 exception=exception or ("RuntimeError" if error else None), **attrs)
        self.t += dur
        return s

    def end(self, error: bool = False, exception: str | None = None, **kw) -> Span:
        attrs = {"gen_ai__operation__name": "invoke_agent", "gen_ai__agent__name": self.agent,
                 "pydantic_ai__all_messages": SECRET, "final_result": SECRET}
        attrs.update(kw)
        return span(self.tid, f"invoke_agent {self.agent}", self.start_ms, self.t + 1, sid=self.sid,
                    error=error, exception=exception, **attrs)
