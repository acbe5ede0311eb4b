"""The producer hook: what an agent runtime's spans cannot tell, recorded as ``loopwarden.*`` attributes.

A Python runtime ends its spans OK when the application cancels the run or its own timeout fires,
and an approval or a stop condition that does not raise leaves no mark at all: the bridge then
reports the cause as not recorded (UNCERTAIN). This module lets the application say it, in the
attributes of docs/opentelemetry.md ("The producer hook"), and never records content: only the ids,
names and numbers the application passes, the contract's cause words and exception type names.

Setup is one wrapper around the processor that exports::

    provider.add_span_processor(RunSpans(BatchSpanProcessor(OTLPSpanExporter())))

Spans started inside a run scope (``with run(...)``, or a task from :func:`start_run`) are that
run's: the scope is a context variable, so the runtime's own tasks and context-copying threads
carry it. Every span is passed on to the wrapped processor as it ends, except the scope's run
spans (the bridge's own mapping tells which), which wait for the scope to exit: they end last, at
the run's end, and the marks made after the runtime returned (``result.interruptions``, a deferred
output) are added to them then. So a hung run's spans still reach the bridge as they end.

A span ends before it is exported, and a run hung in its first model call has ended none: so as a
run span starts, the hook also exports a **start marker**, a child of it that ends at once, holds no
content and carries the run's attributes (``loopwarden.marker``): the bridge publishes the run from
it, and the run goes STUCK if nothing follows. The hook knows a run span as it starts by the
attributes it starts with, or by its GenAI name ``invoke_agent <agent>`` (ADK sets its attributes at
the end). A runtime that tells its spans only at their end (LangGraph through OpenInference) starts its
run span showing nothing: in a scope given a run id, the scope's first span, when it starts telling
nothing of what it is, is taken for the run and gets the marker (one per scope, as a run span's). Without a
run id there is none: LangGraph's ``thread_id``, read as its spans end, then names the run.
"""

from __future__ import annotations

import asyncio
import contextvars
import threading
import weakref
from collections.abc import Awaitable, Mapping, Sequence
from typing import Any, TypeVar

import msgspec

from loopwarden.codecs.events import Policy
from loopwarden.stages.otel.mapping import ROLE_OTHER, ROLE_RUN, classify, select_runtime

try:
    from opentelemetry import trace as trace_api
    from opentelemetry.sdk.trace import Event, ReadableSpan, SpanProcessor
    from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
except ImportError as exc:  # the base install has no OpenTelemetry: say what to install
    raise ImportError("loopwarden.stages.otel.hook needs the OpenTelemetry SDK: pip install opentelemetry-sdk") from exc

__all__ = [
    "Run", "RunSpans", "cancel_run", "current", "mark_approval", "record_policy", "run", "run_with_timeout",
    "start_run", "stop_condition",
]

T = TypeVar("T")

RUN_ID = "loopwarden.run.id"
AGENT = "loopwarden.agent"
MARKER = "loopwarden.marker"
RUN_START = "run_start"
INVOKE_AGENT = "invoke_agent "  # the GenAI span name of a run: "invoke_agent <agent name>"
STOP_CAUSE = "loopwarden.stop.cause"
STOP_FIRED = "loopwarden.stop.fired"
POLICY = "loopwarden.policy"
JOB_ID = "loopwarden.job.id"
ATTEMPT = "loopwarden.attempt"
RECOVERS = "loopwarden.recovers"
APPROVAL = "loopwarden.approval."

_current: contextvars.ContextVar[Run | None] = contextvars.ContextVar("loopwarden_run", default=None)
_tasks: weakref.WeakKeyDictionary[asyncio.Task, Run] = weakref.WeakKeyDictionary()
_ids = RandomIdGenerator()


def _text(name: str, value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError(f"{name} must be a non-empty string, got {value!r}")
    return value


def _policy_json(policy: Policy | Mapping[str, Any]) -> str:
    try:
        checked = policy if isinstance(policy, Policy) else msgspec.convert(policy, Policy)
    except msgspec.ValidationError as exc:
        raise ValueError(f"policy {policy!r} is not a loopwarden Policy: {exc}") from None
    return msgspec.json.encode(checked).decode()


def _is_run_span(span: ReadableSpan) -> bool:
    """The bridge's own mapping decides which span is a run (its row, read from the final attributes)."""
    attrs = span.attributes or {}
    scope = span.instrumentation_scope.name if span.instrumentation_scope is not None else ""
    _, row = select_runtime(scope, span.name, attrs)
    return classify(row, span.name, attrs) == ROLE_RUN


def _starts_run(span: Any) -> tuple[bool, str]:
    """(whether a span just started is a run span, the agent name it gives), as far as its start tells: the
    bridge's mapping on the attributes it starts with, else its GenAI name ``invoke_agent <agent>`` where its
    row takes ``invoke_agent`` spans for runs."""
    attrs = span.attributes or {}
    scope = span.instrumentation_scope.name if span.instrumentation_scope is not None else ""
    _, row = select_runtime(scope, span.name, attrs)
    named = span.name[len(INVOKE_AGENT):].strip() if span.name.startswith(INVOKE_AGENT) else ""
    if classify(row, span.name, attrs) == ROLE_RUN:
        given = attrs.get("gen_ai.agent.name")
        # a row whose spans all give one generic agent name (OpenAI Agents) names the agent in the span name
        agent = named if row.agent_on_run_only or not isinstance(given, str) or not given else given
        return True, agent
    if (named and "invoke_agent" in row.run_ops and not row.run_needs_agent_name
            and attrs.get("gen_ai.operation.name") in (None, "invoke_agent")):
        return True, named
    return False, ""


# the GenAI span name is "<operation> <target>": a span starting under one of these names says what it is
_GENAI_OPS = frozenset(("chat", "generate_content", "text_completion", "embeddings", "execute_tool", "invoke_agent",
                        "create_agent", "invoke_workflow"))


def _tells_nothing(span: Any) -> bool:
    """Whether a span starts with nothing telling its role: no operation or span kind, no telling name."""
    attrs = span.attributes or {}
    if "gen_ai.operation.name" in attrs or "openinference.span.kind" in attrs or "ai.operationId" in attrs:
        return False
    if span.name.split(" ", 1)[0] in _GENAI_OPS:
        return False
    scope = span.instrumentation_scope.name if span.instrumentation_scope is not None else ""
    _, row = select_runtime(scope, span.name, attrs)
    return classify(row, span.name, attrs) == ROLE_OTHER


def _start_marker(span: Any, attrs: dict[str, Any]) -> ReadableSpan:
    """The start marker of a run span that just started: its child, ended at once, with ``attrs`` only."""
    ctx = span.get_span_context()
    mine = trace_api.SpanContext(ctx.trace_id, _ids.generate_span_id(), is_remote=False,
                                 trace_flags=ctx.trace_flags, trace_state=ctx.trace_state)
    return ReadableSpan(
        name="loopwarden.run_start", context=mine, parent=ctx, resource=span.resource,
        attributes={MARKER: RUN_START, **attrs}, kind=trace_api.SpanKind.INTERNAL, start_time=span.start_time,
        end_time=span.start_time, instrumentation_scope=span.instrumentation_scope)


def _marked(span: ReadableSpan, attrs: dict[str, Any], events: tuple[Event, ...]) -> ReadableSpan:
    """A copy of an ended span with ``attrs`` and ``events`` added (ended spans are read-only)."""
    return ReadableSpan(
        name=span.name, context=span.context, parent=span.parent, resource=span.resource,
        attributes={**(span.attributes or {}), **attrs}, events=tuple(span.events) + events, links=span.links,
        kind=span.kind, status=span.status, start_time=span.start_time, end_time=span.end_time,
        instrumentation_scope=span.instrumentation_scope)


class Run:
    """One agent run: the spans started in its scope, and what the application recorded about it.

    Use it as a context manager around the runtime's call (``with run(run_id=...) as r:``). The
    first stop recorded wins (a timeout, then the cancellation it causes, is a timeout)."""

    def __init__(self, run_id: str | None = None, *, policy: Policy | Mapping[str, Any] | None = None,
                 job_id: str | None = None, attempt: int | None = None, recovers: str | None = None,
                 agent: str | None = None) -> None:
        self._lock = threading.Lock()
        self._run_attrs: dict[str, Any] = {}
        if run_id is not None:
            self._run_attrs[RUN_ID] = _text("run_id", run_id)
        # the agent's name goes on the run's start marker only: a runtime whose runs are told only at their end
        # (ADK, LangGraph) gives the run-level attributes to a sub-agent's spans too, which this would misname
        self._agent = {AGENT: _text("agent", agent)} if agent is not None else {}
        if job_id is not None:
            self._run_attrs[JOB_ID] = _text("job_id", job_id)
        if attempt is not None:
            if not isinstance(attempt, int) or isinstance(attempt, bool) or attempt < 1:
                raise ValueError(f"attempt must be an int >= 1, got {attempt!r}")
            self._run_attrs[ATTEMPT] = attempt
        if recovers is not None:
            self._run_attrs[RECOVERS] = _text("recovers", recovers)
        if policy is not None:
            self.record_policy(policy)
        self._stop: dict[str, Any] = {}  # STOP_* and APPROVAL* attributes for the run span
        self._stop_event: str | None = None  # the exception type a cancel or timeout adds to the run span
        self._open: dict[int, Any] = {}  # span id -> the live span, while it is open
        self._parent: dict[int, int] = {}  # span id -> parent span id, for every span of the scope
        self._runs: set[int] = set()  # spans that were run spans when they started
        self._outer: int | None = None  # the outermost of them
        self._started_runs = 0  # run spans a start marker was sent for
        self._spans = 0  # spans started in the scope
        self._held: list[tuple[RunSpans, ReadableSpan]] = []
        self._closed = False
        self._token: contextvars.Token | None = None

    # -- the scope ------------------------------------------------------------------------------
    def __enter__(self) -> Run:
        self._token = _current.set(self)
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if self._token is not None:
            _current.reset(self._token)
            self._token = None
        self.close(exc)

    def close(self, exc: BaseException | None = None) -> None:
        """Pass the held run spans on, the marks on the outermost one that ended last.

        An exception leaving the scope that the run span's runtime row calls a cancellation or a
        timeout (``RunCancelled``, ``RunTimedOut``, ``TimeoutError`` ...) is recorded as one, when
        nothing else was; not a ``CancelledError``, which a timeout around the scope raises too."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            held, self._held = self._held, []
        if not held:
            return
        ids = {s.context.span_id for _, s in held}
        outer = [(p, s) for p, s in held if not self._has_ancestor_in(s.context.span_id, ids)]
        final = max(outer, key=lambda ps: ps[1].end_time or 0)[1]
        for processor, span in held:
            if span is final:
                span = self._finalized(span, exc)
            processor.forward(span)

    def _has_ancestor_in(self, span_id: int, ids: set[int]) -> bool:
        node = self._parent.get(span_id)
        for _ in range(256):  # parent ids come from the runtime: a bounded walk
            if node is None:
                return False
            if node in ids:
                return True
            node = self._parent.get(node)
        return False

    def _finalized(self, span: ReadableSpan, exc: BaseException | None) -> ReadableSpan:
        # the run-level attributes only where the run is the outer one (an agent handed off to is a run of its own)
        outer = self._outer is None or self._outer == span.context.span_id
        attrs = {**(self._run_attrs if outer else {}), **self._stop}
        events: tuple[Event, ...] = ()
        if STOP_CAUSE not in attrs and exc is not None:
            name = type(exc).__name__
            scope = span.instrumentation_scope.name if span.instrumentation_scope is not None else ""
            _, row = select_runtime(scope, span.name, span.attributes or {})
            # a CancelledError leaving the scope may be a timeout's (asyncio.wait_for around the scope): not
            # recorded, as the bridge reads it unmarked; cancel_run and run_with_timeout say which it was
            cause = ("timeout" if name in row.timeouts else None if name in row.cancel_or_timeout
                     else "aborted" if name in row.cancelled else None)
            if cause is not None:
                attrs[STOP_CAUSE] = cause
                if not any(e.name == "exception" and (e.attributes or {}).get("exception.type") == name
                           for e in span.events):
                    events = (Event("exception", {"exception.type": name}),)
        return _marked(span, attrs, events) if attrs or events else span

    # -- what the processor tells the run ---------------------------------------------------------
    def _started(self, span: Any) -> ReadableSpan | None:
        """Note a span of the run as it starts; the start marker to export when it is a run span."""
        ctx = span.get_span_context()
        parent = span.parent
        is_run = _is_run_span(span)  # by the attributes it starts with: some runtimes name a run only at its end
        with self._lock:
            first_span = self._spans == 0
            self._spans += 1
            self._open[ctx.span_id] = span
            if parent is not None:
                self._parent[ctx.span_id] = parent.span_id
            if is_run:
                self._runs.add(ctx.span_id)
            owner = ctx.span_id if is_run else self._run_above(ctx.span_id)
            if owner is not None and self._outer is None:
                self._outer = owner  # the first run span to start is the outermost
            # The bridge fixes a run's id and policy with its first span to arrive, a model or tool call
            # (spans arrive as they end): the outer run's spans carry them from their start, not a
            # sub-agent's (where no run is named yet, every span does).
            ours = owner is None or owner == self._outer
            stop = self._stop_event
        blank = first_span and RUN_ID in self._run_attrs and _tells_nothing(span)  # before the run's marks
        if ours and self._run_attrs:
            span.set_attributes(self._run_attrs)
        if stop is not None:  # a span started after the cancel (a cleanup step) is part of the stop too
            self._stamp(span, stop)
        starts, agent = _starts_run(span)
        if not starts:
            if not blank:
                return None
            # A span telling nothing as it starts may be a run span told only at its end (LangGraph's graph
            # span through OpenInference): first in a scope that names its run, it is the run. The marker
            # names the agent as the bridge would from the run span (its name), unless the scope does.
            with self._lock:
                self._started_runs += 1
            name = {AGENT: span.name[:100]} if span.name else {}
            return _start_marker(span, {**name, **self._run_attrs, **self._agent})
        with self._lock:
            first = self._started_runs == 0  # the first run span of the scope is its run; a later one a sub-agent
            self._started_runs += 1
        marks = {AGENT: agent} if agent else {}
        return _start_marker(span, {**marks, **self._run_attrs, **self._agent} if first else marks)

    def _run_above(self, span_id: int) -> int | None:
        node = self._parent.get(span_id)
        for _ in range(256):  # parent ids come from the runtime: a bounded walk
            if node is None or node in self._runs:
                return node
            node = self._parent.get(node)
        return None

    def _ended(self, processor: RunSpans, span: ReadableSpan) -> bool:
        """True when the run keeps ``span`` until the scope exits (a run span, the scope still open)."""
        with self._lock:
            self._open.pop(span.context.span_id, None)
            if self._closed or not _is_run_span(span):
                return False
            self._held.append((processor, span))
            return True

    # -- what the application records ---------------------------------------------------------------
    def record_policy(self, policy: Policy | Mapping[str, Any]) -> None:
        """The run's stop policy (a loopwarden Policy, or its JSON form as a dict), so its bounds are evaluated.

        Record it before the run starts (``run(policy=...)``): the bridge takes it from the run's first span."""
        self._run_attrs[POLICY] = _policy_json(policy)

    def stop_condition(self, fired: Sequence[str]) -> None:
        """The run stopped because these stop conditions were true (a stop that does not raise)."""
        if isinstance(fired, str) or not fired:
            raise ValueError(f"fired must be a non-empty list of condition ids, got {fired!r}")
        ids = tuple(_text("a fired condition id", f) for f in fired)
        with self._lock:
            if STOP_CAUSE not in self._stop:
                self._stop.update({STOP_CAUSE: "stop_condition", STOP_FIRED: ids})

    def mark_approval(self, tool_call_id: str, tool_name: str, *, approval_id: str | None = None,
                      owner: str | None = None, deadline_ts: int | None = None,
                      resume_token: str | None = None) -> None:
        """The run stopped to ask for approval of this tool call (an approval that does not raise).

        Call it inside the scope, while the run runs or after the runtime returned. A tool span open
        and current at the call gets the approval attributes too."""
        marks: dict[str, Any] = {
            APPROVAL + "id": _text("approval_id", approval_id if approval_id is not None else tool_call_id),
            APPROVAL + "tool_call_id": _text("tool_call_id", tool_call_id),
            APPROVAL + "tool_name": _text("tool_name", tool_name),
        }
        if owner is not None:
            marks[APPROVAL + "owner"] = _text("owner", owner)
        if deadline_ts is not None:
            if not isinstance(deadline_ts, int) or isinstance(deadline_ts, bool) or deadline_ts < 0:
                raise ValueError(f"deadline_ts must be epoch milliseconds (an int >= 0), got {deadline_ts!r}")
            marks[APPROVAL + "deadline_ts"] = deadline_ts
        if resume_token is not None:
            marks[APPROVAL + "resume_token"] = _text("resume_token", resume_token)
        live = trace_api.get_current_span()
        with self._lock:
            if STOP_CAUSE in self._stop:
                return
            self._stop.update({STOP_CAUSE: "approval_required", **marks})
            current_open = self._open.get(live.get_span_context().span_id) is live
        if current_open:
            live.set_attributes(marks)

    def stop_now(self, cause: str, exception_type: str) -> None:
        """The run is being stopped from outside (``aborted``, ``timeout``): every span still open gets
        the cause and an ``exception`` event of ``exception_type`` (no message), before the cancel."""
        with self._lock:
            if STOP_CAUSE in self._stop:
                return
            self._stop[STOP_CAUSE] = cause
            self._stop_event = exception_type
            spans = list(self._open.values())
        for span in spans:
            self._stamp(span, exception_type)

    def _stamp(self, span: Any, exception_type: str) -> None:
        span.set_attribute(STOP_CAUSE, self._stop[STOP_CAUSE])
        span.add_event("exception", {"exception.type": exception_type})


class RunSpans(SpanProcessor):
    """Wraps the processor that exports (``BatchSpanProcessor``, ``SimpleSpanProcessor``): groups each
    run's spans and adds the run's marks to its run span on the way."""

    def __init__(self, export: SpanProcessor) -> None:
        self._export = export
        self._runs: dict[int, Run] = {}  # open span id -> its run

    def on_start(self, span: Any, parent_context: Any = None) -> None:
        run = _current.get()
        marker = None
        if run is not None:
            self._runs[span.get_span_context().span_id] = run
            marker = run._started(span)
        self._export.on_start(span, parent_context=parent_context)
        if marker is not None:
            self._export.on_end(marker)

    def on_end(self, span: ReadableSpan) -> None:
        run = self._runs.pop(span.context.span_id, None)
        if run is None or not run._ended(self, span):
            self._export.on_end(span)

    def forward(self, span: ReadableSpan) -> None:
        """A held span, passed on to the exporting processor."""
        self._export.on_end(span)

    def shutdown(self) -> None:
        self._export.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self._export.force_flush(timeout_millis)


# -- the helpers ---------------------------------------------------------------------------------------
def run(run_id: str | None = None, **kw: Any) -> Run:
    """A run scope: ``with run(run_id="r-1", policy={...}) as r: result = agent.run_sync(...)``."""
    return Run(run_id, **kw)


def current() -> Run:
    """The run whose scope the caller is in."""
    found = _current.get()
    if found is None:
        raise RuntimeError("no loopwarden run scope here: call it inside `with hook.run(...)` or a start_run() task")
    return found


def record_policy(policy: Policy | Mapping[str, Any]) -> None:
    """:meth:`Run.record_policy` on the current run."""
    current().record_policy(policy)


def stop_condition(fired: Sequence[str]) -> None:
    """:meth:`Run.stop_condition` on the current run."""
    current().stop_condition(fired)


def mark_approval(tool_call_id: str, tool_name: str, **kw: Any) -> None:
    """:meth:`Run.mark_approval` on the current run."""
    current().mark_approval(tool_call_id, tool_name, **kw)


async def _scoped(scope: Run, aw: Awaitable[T]) -> T:
    with scope:
        return await aw


def start_run(aw: Awaitable[T], run_id: str | None = None, **kw: Any) -> asyncio.Task[T]:
    """Run ``aw`` (e.g. ``agent.run(...)``) as a task in a run scope of its own, for :func:`cancel_run`."""
    scope = Run(run_id, **kw)
    task = asyncio.ensure_future(_scoped(scope, aw))
    _tasks[task] = scope
    return task


def cancel_run(task: asyncio.Task) -> bool:
    """Cancel a :func:`start_run` task, its still-open spans first marked ``aborted`` (CancelledError)."""
    scope = _tasks.get(task)
    if scope is None:
        raise ValueError(f"{task!r} was not started by loopwarden.stages.otel.hook.start_run")
    if task.done():
        return False
    scope.stop_now("aborted", "CancelledError")
    return task.cancel()


async def run_with_timeout(aw: Awaitable[T], timeout_s: float, run_id: str | None = None, **kw: Any) -> T:
    """``aw`` in a run scope, bounded by ``timeout_s``: past it, the still-open spans are marked
    ``timeout`` (TimeoutError), the run is cancelled, and ``TimeoutError`` is raised."""
    task = start_run(aw, run_id, **kw)
    try:
        done, _ = await asyncio.wait({task}, timeout=timeout_s)
    except asyncio.CancelledError:  # the caller itself was cancelled: so is the run
        cancel_run(task)
        raise
    if done:
        return task.result()
    _tasks[task].stop_now("timeout", "TimeoutError")
    task.cancel()
    try:
        await task
    except (asyncio.CancelledError, Exception):  # what the cancelled run raised: the timeout is the fact
        pass
    raise TimeoutError(f"the run did not finish within {timeout_s} s")
