"""The bridge's pure core: a trace's spans in, contract events out (spec.md section 9).

Spans arrive as they end — children first, the run span last — across many messages.
:func:`fold_trace` adds a message's spans of one trace to that trace's
:class:`TraceState` and returns the events that became due, in order:

- ``run_started`` when a run's first span arrives (the run span itself, the producer hook's
  start marker, or a span whose run it is: see ``Runtime.parent_is_run``);
- ``step_finished`` for a model call once the next model call of the run has arrived (its
  tool calls are then known) or the run span has ended;
- ``run_ended`` when the run span arrives, with the cause of section 9's rules.

No I/O, no clock: ``now_ms`` is an argument (it stamps only the trace's last activity, for
retention). The state records what was published, so a fold after a restart from the
committed state publishes nothing twice.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from operator import attrgetter

import msgspec

from loopwarden.codecs.events import (
    Approval,
    Custom,
    EventsDropped,
    Policy,
    RunEnded,
    RunStarted,
    StepFinished,
    ToolCall,
    Usage,
)
from loopwarden.stages.otel.mapping import (
    ROLE_MARK,
    ROLE_MODEL,
    ROLE_OTHER,
    ROLE_RUN,
    ROLE_TOOL,
    ROLE_WRAPPER,
    RUNTIMES,
    Runtime,
)
from loopwarden.stages.otel.spans import Span

FINISH = {
    "stop": "stop", "end_turn": "stop", "length": "length", "max_tokens": "length",
    "content_filter": "content-filter", "content-filter": "content-filter",
    "tool_calls": "tool-calls", "tool-calls": "tool-calls", "tool_call": "tool-calls", "tool_use": "tool-calls",
    "error": "error", "other": "other", "unknown": "other",
}
NS_PER_MS = 1_000_000


class RunProgress(msgspec.Struct, array_like=True, gc=False):
    """One run (keyed by its run span id): what was published, and what is still open.

    Only the spans that can still change an event are kept: the model calls not yet published, the
    last published one, and the tool calls that may belong to them (``open``). A published step's
    spans are dropped from the trace's state, so a long run costs what its open steps hold."""

    started: bool = False
    ended: bool = False
    steps: int = 0  # steps published
    last_step: str = ""  # span id of the last published step's model call
    last_step_start: int = -1  # its start (ns): a model call starting before it is too late to place
    open: list[str] = []  # unpublished model calls, and tool calls starting at or after last_step_start
    first_ns: int = 0  # earliest start among the run's spans seen (0: none yet)
    agent: str = ""  # the first gen_ai.agent.name seen on its spans
    scope: str = ""  # the instrumentation scope of its first span
    runtime: int = 0  # the mapping row of its first span
    last_end: int = 0  # end (ns) of the model or tool call that ended last ...
    last_tool_error: bool = False  # ... and whether it was a tool call in ERROR
    close_ms: int = 0  # the run span arrived: run_ended is due at this processing time (0: not yet arrived)
    open_ms: int = 0  # no span has named the agent yet: run_started waits until this processing time
    lost: int = 0  # spans of the run the decoder refused (Span.lost) ...
    lost_sent: int = 0  # ... and how many of them an events_dropped already reported
    # The producer hook (spans.Hook): the run id and policy its spans gave before run_started (fixed then),
    # and how many hook attributes its spans carried that were refused
    key: str = ""
    policy: Policy | None = None
    bad: int = 0
    segment: int = 0  # the segment of its events: 0, or (with a producer run id) its run_started ts
    late_models: int = 0  # model calls that arrived after a later step was published: steps lost
    late_tools: int = 0  # tool calls that arrived after their step was published


class TraceState(msgspec.Struct, array_like=True, gc=False):
    """One trace: its spans (content-free), its runs' progress, its last activity."""

    spans: dict[str, Span] = {}
    runs: dict[str, RunProgress] = {}
    # model and tool calls whose run is not known yet, by the missing ancestor they wait for
    waiting: dict[str, list[str]] = {}
    last_ms: int = 0  # processing time of the last span that arrived (retention)
    dropped: int = 0  # spans refused because the trace was full
    held: int = 0  # spans ever accepted (dropped ones excluded): the bound counts these


encode_trace = msgspec.msgpack.Encoder().encode
decode_trace = msgspec.msgpack.Decoder(TraceState).decode


@dataclass(frozen=True)
class Limits:
    max_spans_per_trace: int = 100_000
    trace_retention_s: float = 3600.0  # a trace with no new span for this long is dropped
    # How long after its run span a run's last step and run_ended wait for spans that end after the run
    # span (a tool cut short by a cancellation ends after it in Python runtimes; one export batch may
    # close before the other). 0: at once. Released by the task's punctuation (when caught up). A run
    # that ended cleanly after a model call that finished without asking for tools does not wait
    # (:func:`end_grace_ms`): nothing of it can still be running.
    end_grace_s: float = 2.0
    # How long a run whose spans do not name its agent (gen_ai.agent.name, or its run span) waits for them
    # before it starts under its runtime's name. Runs shorter than an export interval arrive whole.
    start_grace_s: float = 30.0


@dataclass
class TraceEvents:
    """What folding a trace's spans gives: the run events now due, and the counts of what became of the spans."""

    events: list = field(default_factory=list)  # RunStarted | StepFinished | RunEnded, in publish order
    counts: dict[str, int] = field(default_factory=dict)  # label -> n ("spans", "span_after_end", ...)


def run_id_of(trace_id: str, run_span_id: str) -> str:
    return f"otel-{trace_id}-{run_span_id}"


def _ms(ns: int) -> int:
    return ns // NS_PER_MS


def fold_trace(state: TraceState | None, trace_id: str, spans: list[Span], now_ms: int,
               limits: Limits = Limits()) -> tuple[TraceState, TraceEvents]:
    """Add ``spans`` (all of trace ``trace_id``) to ``state``; the events now due.

    ``state`` is changed in place when given (a fresh one is made otherwise)."""
    out = TraceEvents()
    counts = out.counts
    if state is None:
        state = TraceState(spans={}, runs={}, waiting={})
    known = state.spans
    new: list[Span] = []
    duplicates = full = hook_bad = 0
    held, cap = state.held, limits.max_spans_per_trace
    for span in spans:
        span_id = span.span_id
        if span_id in known:
            duplicates += 1
        elif held >= cap:
            full += 1
        else:
            known[span_id] = span
            held += 1
            new.append(span)
            if span.hook is not None and span.hook.bad:  # any span's, wrappers' included
                hook_bad += span.hook.bad
    state.held = held
    if duplicates:
        counts["span_duplicate"] = duplicates
    if full:
        state.dropped += full
        counts["span_trace_full"] = full
    if not new:
        return state, out
    counts["spans"] = len(new)
    state.last_ms = max(state.last_ms, now_ms)
    # A span is placed in its run once its ancestors say which run it is. Spans still waiting for an
    # ancestor are filed under the id they wait for, and tried again when a span of that id arrives.
    queue = new
    waiting = state.waiting
    runs = state.runs
    touched: dict[str, None] = {}
    after_end = late = misplaced = 0
    i = 0
    while i < len(queue):
        span = queue[i]
        i += 1
        if waiting:
            woken = waiting.pop(span.span_id, None)
            if woken:
                queue += [known[w] for w in woken if w in known]
        role = span.role
        if role == ROLE_OTHER and span.span_id in runs and RUNTIMES[span.runtime].wrapper_parent_is_run:
            # the graph span a node's span took for its run, though nothing of its own marks it: a sub-graph
            span = known[span.span_id] = msgspec.structs.replace(span, role=ROLE_RUN)
            role = ROLE_RUN
        elif role != ROLE_RUN and span.span_id in runs:
            # A missing parent taken for a run (see Runtime.parent_is_run) arrived and is none: a wrapper of a
            # runtime read by another row (an AI SDK 7 tracer of another name). Its spans are placed again,
            # through it, unless the guessed run was already published.
            guessed = runs[span.span_id]
            if not guessed.started:
                del runs[span.span_id]
                touched.pop(span.span_id, None)
                queue += [known[x] for x in guessed.open if x in known]
            else:
                misplaced += 1
        if role == ROLE_RUN:
            run = span.span_id
        elif role == ROLE_MODEL or role == ROLE_TOOL:
            # _owner's first step inline: the parent is the run span, or missing and taken for it
            run = span.parent_id
            above = known.get(run) if run else None
            if not run or not (above.role == ROLE_RUN if above is not None
                               else role in RUNTIMES[span.runtime].parent_is_run):
                run, missing = _owner(known, span)
                if run is None:
                    if missing:
                        waiting.setdefault(missing, []).append(span.span_id)
                    continue
        elif role == ROLE_MARK:
            # the hook's start marker, a child of its run span (still open when the marker was sent): read once
            run = span.parent_id
            above = known.get(run) if run else None
            known.pop(span.span_id, None)
            if not run or (above is not None and above.role != ROLE_RUN):
                continue
        else:
            if role == ROLE_WRAPPER and RUNTIMES[span.runtime].wrapper_parent_is_run:
                _graph_is_run(known, runs, touched, span)
            continue  # wrappers and other spans only link children to their run
        progress = runs.get(run)
        if progress is None:
            progress = runs[run] = RunProgress(open=[])
        if progress.ended:
            after_end += 1
            known.pop(span.span_id, None)
            continue
        if span.lost:  # a refused span costs itself: its run reports the loss; a run span still closes its run
            progress.lost += 1
            touched[run] = None
            if role != ROLE_RUN:
                continue
        if role != ROLE_RUN:
            if role == ROLE_MARK:
                _mark(progress, span)
                touched[run] = None
                continue
            if span.start_ns < progress.last_step_start:  # older than a step already published
                late += 1
                if role == ROLE_MODEL:
                    progress.late_models += 1
                else:
                    progress.late_tools += 1
                del known[span.span_id]
                continue
            _join(progress, span)
        touched[run] = None
    if after_end:
        counts["span_after_end"] = after_end
    if late:
        counts["span_late"] = late
    if hook_bad:
        counts["hook_attribute_bad"] = hook_bad
    if misplaced:
        counts["run_guessed_wrong"] = misplaced
    for run in (touched if len(touched) == 1 else sorted(touched, key=lambda r: _first_start(state, r))):
        _advance(state, trace_id, run, out, now_ms, limits)
    return state, out


def _join(progress: RunProgress, span: Span) -> None:
    """A model or tool call joins its run's open spans and what the run keeps of all of them."""
    if not progress.first_ns or span.start_ns < progress.first_ns:
        progress.first_ns = span.start_ns
    if not progress.scope:
        progress.scope, progress.runtime = span.scope, span.runtime
    if not progress.agent and span.agent:
        progress.agent = span.agent
    hook = span.hook
    if hook is not None:
        progress.bad += hook.bad
        if not progress.started:
            if hook.run_id and not progress.key:
                progress.key = hook.run_id
            if hook.policy is not None and progress.policy is None:
                progress.policy = hook.policy
    is_tool = span.role == ROLE_TOOL
    if span.end_ns > progress.last_end or (span.end_ns == progress.last_end and is_tool):
        progress.last_end = span.end_ns
        progress.last_tool_error = is_tool and span.error
    progress.open.append(span.span_id)


def _mark(progress: RunProgress, span: Span) -> None:
    """The hook's start marker: the run's start, row, agent, run id and policy, before any of its calls ended."""
    if not progress.first_ns or span.start_ns < progress.first_ns:
        progress.first_ns = span.start_ns
    if not progress.scope:
        progress.scope, progress.runtime = span.scope, span.runtime
    if span.agent and not progress.started:
        progress.agent = span.agent  # the run's own name, over a child's gen_ai.agent.name
    hook = span.hook
    if hook is not None:
        progress.bad += hook.bad
        if not progress.started:
            if hook.run_id:
                progress.key = hook.run_id
            if hook.policy is not None:
                progress.policy = hook.policy


def close_due(state: TraceState, trace_id: str, now_ms: int, limits: Limits = Limits()) -> TraceEvents:
    """Publish what the runs whose start or end grace has passed now owe (run_started; last step, run_ended)."""
    out = TraceEvents()
    due = [run for run, p in state.runs.items()
           if (p.close_ms and not p.ended and p.close_ms <= now_ms) or (p.open_ms and not p.started and p.open_ms <= now_ms)]
    for run in sorted(due, key=lambda r: _first_start(state, r)):
        _advance(state, trace_id, run, out, now_ms, limits)
    return out


def next_close(state: TraceState) -> int | None:
    """When the next run of the trace is due to start or close (None: none waiting)."""
    return min([p.close_ms for p in state.runs.values() if p.close_ms and not p.ended]
               + [p.open_ms for p in state.runs.values() if p.open_ms and not p.started], default=None)


def _graph_is_run(known: dict[str, Span], runs: dict[str, RunProgress], touched: dict[str, None],
                  wrapper: Span) -> None:
    """A node's span whose graph span arrived first, unmarked (a sub-graph's): the graph span is a run."""
    above = known.get(wrapper.parent_id) if wrapper.parent_id else None
    if above is not None and above.role == ROLE_OTHER and above.runtime == wrapper.runtime:
        known[above.span_id] = msgspec.structs.replace(above, role=ROLE_RUN)
        if above.span_id not in runs:
            runs[above.span_id] = RunProgress(open=[])
        touched[above.span_id] = None


def _owner(known: dict[str, Span], span: Span) -> tuple[str | None, str]:
    """(the run span id a span belongs to, ""), or (None, the missing ancestor it waits for; "" when it
    has none: a root that is no run). The run is its nearest run ancestor; a missing ancestor is taken
    for the run when the runtime's row says that role's parent is the run."""
    row = RUNTIMES[span.runtime]
    node = span
    for _ in range(64):  # a bounded walk: a cycle of parent ids cannot hang the fold
        parent = node.parent_id
        if not parent:
            return None, ""
        above = known.get(parent)
        if above is None:
            return (parent, "") if node.role in row.parent_is_run else (None, parent)
        if above.role == ROLE_RUN:
            return parent, ""
        node = above
    return None, ""


def _first_start(state: TraceState, run: str) -> int:
    progress = state.runs.get(run)
    run_span = state.spans.get(run)
    starts = [progress.first_ns] if progress is not None and progress.first_ns else []
    if run_span is not None:
        starts.append(run_span.start_ns)
    return min(starts, default=0)


def _advance(state: TraceState, trace_id: str, run: str, out: TraceEvents, now_ms: int, limits: Limits) -> None:
    known = state.spans
    run_span = known.get(run)
    progress = state.runs.get(run)
    if progress is None:
        progress = state.runs[run] = RunProgress(open=[])
    closing = run_span is not None and not progress.ended
    if closing and not progress.close_ms:
        progress.close_ms = max(1, now_ms + end_grace_ms(state, run_span, progress, limits))
    closed = closing and progress.close_ms <= now_ms
    if run_span is None and not progress.scope:
        return  # nothing of the run arrived yet
    row = RUNTIMES[run_span.runtime if run_span is not None else progress.runtime]
    if not progress.started:
        agent = _agent(run_span, progress)
        if agent is None:
            if not progress.open_ms:
                progress.open_ms = max(1, now_ms + int(limits.start_grace_s * 1000))
            if progress.open_ms > now_ms:
                return  # nothing of the run goes out before its run_started
            agent = row.name
        progress.started = True
        hook = run_span.hook if run_span is not None else None
        if hook is not None:
            if hook.run_id:
                progress.key = hook.run_id  # the run span's own word wins over its children's
            if hook.policy is not None:
                progress.policy = hook.policy
        if progress.key and any(p.key == progress.key for r, p in state.runs.items() if r != run and p.started):
            progress.key = ""  # another run of the trace has this run id: this one keeps its own
            out.counts["hook_run_id_reused"] = out.counts.get("hook_run_id_reused", 0) + 1
        start_ms = _ms(_first_start(state, run))
        if progress.key:
            # A producer's run id may come back in later traces (a resumed interrupt, an approval's resume),
            # which may be on other partitions: each trace's part of the run is a segment numbered by its own
            # start, so later parts have higher segments with no state shared between traces.
            progress.segment = start_ms
        out.events.append(RunStarted(run_id=progress.key or run_id_of(trace_id, run), ts=start_ms, agent=agent,
                                     policy=_policy(row, run_span, progress)))
    run_id = progress.key or run_id_of(trace_id, run)
    segment = progress.segment
    if progress.lost > progress.lost_sent:  # the worker then judges the run UNCERTAIN (producer_dropped)
        out.events.append(EventsDropped(run_id=run_id, ts=_ms(_first_start(state, run)),
                                        count=progress.lost - progress.lost_sent))
        progress.lost_sent = progress.lost
    opened = [known[i] for i in progress.open if i in known]
    models = sorted((x for x in opened if x.role == ROLE_MODEL), key=_order)
    tools = sorted((x for x in opened if x.role == ROLE_TOOL), key=_order)
    ready = models if closed else models[:-1]
    asked = _asked(run_span) if closed and ready else None
    j, n_tools, n_models = 0, len(tools), len(models)
    for k, m in enumerate(ready):
        # the tool calls starting in [m.start, next model call's start): tools and models are in start order
        start = m.start_ns
        while j < n_tools and tools[j].start_ns < start:
            j += 1
        end = j
        if k + 1 < n_models:
            window_end = models[k + 1].start_ns
            while end < n_tools and tools[end].start_ns < window_end:
                end += 1
        else:
            end = n_tools
        last = closed and k + 1 == len(ready)
        out.events.append(_step(run_id, progress.steps, m, tools[j:end], segment, row, last
                                and run_span is not None and _bound_exception(row, run_span) is not None,
                                asked if last else None))
        progress.steps += 1
        if progress.last_step:
            known.pop(progress.last_step, None)  # a step before the last: nothing reads it again
        progress.last_step, progress.last_step_start = m.span_id, m.start_ns
    if ready:
        start = progress.last_step_start
        for t in tools:
            if t.start_ns < start:
                known.pop(t.span_id, None)  # a published step's tool call
        progress.open = [x.span_id for x in models[len(ready):]] + [t.span_id for t in tools if t.start_ns >= start]
    if closed:
        progress.ended = True
        last_model = known.get(progress.last_step) if progress.last_step else None
        last_calls = [t for t in tools if last_model is not None and t.start_ns >= last_model.start_ns]
        out.events.append(_ended(run_id, row, run_span, last_model, last_calls, progress))
        if progress.bad or (run_span.hook is not None and run_span.hook.bad):
            out.counts["runs_hook_refused"] = out.counts.get("runs_hook_refused", 0) + 1
        out.counts["runs_ended"] = out.counts.get("runs_ended", 0) + 1
        for span_id in progress.open:  # the run is over: its calls are never read again
            known.pop(span_id, None)
        if progress.last_step:
            known.pop(progress.last_step, None)
        progress.open = []


_order = attrgetter("start_ns", "span_id")  # (start, span id): a C-level key


def end_grace_ms(state: TraceState, run_span: Span, progress: RunProgress, limits: Limits) -> int:
    """How long a run whose run span arrived waits for spans that end after it: 0 when none can.

    Spans are exported as they end, so the run's own calls, which end before it, arrived with or
    before its run span; what ends after it is work the run left running — a tool call it asked
    for and cut short (a cancellation, a timeout), or a call in another task. A run span OK, with no
    exception or approval marker, whose last model call recorded a finish reason that asked for no
    tool and was followed by none, left nothing running: it closes at once. Anything else (an
    error, an exception, a tool request, a model call that recorded no finish reason, spans of the
    trace still waiting for an ancestor) waits ``end_grace_s``. So does a run under a producer's or
    thread's run id: its next segment may be another trace's run that ends cleanly, and closing that
    one at once would overtake this segment still in its grace."""
    grace = int(limits.end_grace_s * 1000)
    if not grace or run_span.error or run_span.exceptions or run_span.approval or state.waiting:
        return grace
    if progress.key or (run_span.hook is not None and run_span.hook.run_id):
        return grace
    known = state.spans
    models = [x for x in (known.get(i) for i in progress.open) if x is not None and x.role == ROLE_MODEL]
    last = max(models, key=_order) if models else (known.get(progress.last_step) if progress.last_step else None)
    if last is None or last.error or last.exceptions or not last.finish:
        return grace
    if FINISH.get(last.finish.lower(), "other") == "tool-calls":
        return grace
    for i in progress.open:
        tool = known.get(i)
        if tool is not None and tool.role == ROLE_TOOL and tool.start_ns >= last.start_ns:
            return grace  # a tool after the last model call: the run stopped mid-step
    return 0


def _agent(run_span: Span | None, progress: RunProgress) -> str | None:
    """gen_ai.agent.name, else the run span's name; None while no span names it (AI SDK 7 names the agent
    on its run span only): the run then waits ``start_grace_s`` for it, then takes its runtime's name."""
    if run_span is not None and run_span.agent:
        return run_span.agent[:100]
    if progress.agent:
        return progress.agent[:100]
    if run_span is not None and run_span.name:
        return run_span.name[:100]
    return None


_policies: dict[tuple[str, str], Policy] = {}  # (row, scope) -> its Policy (frozen): one per scope seen


def _policy(row: Runtime, run_span: Span | None, progress: RunProgress) -> Policy:
    if progress.policy is not None:
        return _hooked_policy(row, progress.policy)
    scope = (run_span.scope if run_span is not None else "") or progress.scope or row.name
    policy = _policies.get((row.name, scope))
    if policy is None:
        if len(_policies) >= 1024:  # scopes come from producers: the cache stays bounded
            _policies.clear()
        bounds = _row_conditions(row)
        # Spans carry no stop policy: only the bounds the runtime enforces by raising are declared.
        policy = _policies[row.name, scope] = Policy(version=f"otel:{scope}"[:200], stop_when=bounds)
    return policy


def _row_conditions(row: Runtime) -> tuple[Custom, ...]:
    """The conditions a runtime enforces itself: its bounds (raised), and a handoff (a completion)."""
    return (tuple(Custom(name=name, role="bound") for _exc, name in row.bounds)
            + ((Custom(name=HANDOFF, role="completion"),) if row.handoff_tools else ()))


def _hooked_policy(row: Runtime, policy: Policy) -> Policy:
    """The producer's policy, with the conditions its runtime enforces by itself added when it lists its own
    (a null ``stop_when`` is the contract's default, left as the producer sent it)."""
    if policy.stop_when is None:
        return policy
    have = {c for cond in policy.stop_when for c in cond.ids}
    extra = tuple(c for c in _row_conditions(row) if c.ids[0] not in have)
    return msgspec.structs.replace(policy, stop_when=policy.stop_when + extra) if extra else policy


HANDOFF = "handoff"  # custom:handoff: the agent handed the conversation to another (a completion of its part)


def _bound_exception(row: Runtime, run_span: Span) -> str | None:
    """The custom bound a run span's exceptions (or the producer hook's cause) say fired; None if none."""
    hook = run_span.hook
    if hook is not None and hook.cause == "stop_condition":
        return hook.fired[0] if hook.fired else "custom:stop"
    for exc in run_span.exceptions:
        bound = row.bound_name(exc)
        if bound is not None:
            return f"custom:{bound}"
    return None


def _finish(model: Span, calls: list[Span]) -> str:
    if model.finish:
        return FINISH.get(model.finish.lower(), "other")
    if model.error:
        return "error"
    # Test models (and some runtimes) record no finish reason: a model call followed by tool
    # calls asked for them; otherwise the reason was not recorded.
    return "tool-calls" if calls else "other"


# A tool call the run's own abort or timeout interrupted is `cancelled` (docs/contract.md section 11),
# never `error`: it is not a tool error.
CANCELLED_STATUS = "cancelled"


def _cancelled(row: Runtime, span: Span) -> bool:
    return bool(span.exceptions) and any(e.rsplit(".", 1)[-1] in row.cancelled for e in span.exceptions)


def _status(tool: Span) -> str:
    if tool.approval:
        return "approval_requested"
    if _cancelled(RUNTIMES[tool.runtime], tool):
        return CANCELLED_STATUS
    if tool.error:
        return "error"
    return "result"


def _asked(run_span: Span | None) -> tuple[str, str] | None:
    """(tool call id, tool name) of the call the producer hook says the run stopped to have approved, when it
    names one on the run span (an approval that came to light after the call's tool span, if any, ended)."""
    hook = run_span.hook if run_span is not None else None
    if hook is None or hook.cause != "approval_required" or not hook.approval_tool_call_id:
        return None
    return hook.approval_tool_call_id, hook.approval_tool_name or "unknown"


def _step(run_id: str, index: int, model: Span, calls: list[Span], segment: int = 0, row: Runtime | None = None,
          bounded: bool = False, asked: tuple[str, str] | None = None) -> StepFinished:
    """A model call and its tool calls as a step. ``bounded``: it is the run's last step and a bound stopped
    the run: a bound that fires after the model asked for tools and before they ran (Pydantic AI's
    tool_calls_limit, LangGraph's recursion_limit) leaves no tool span, and the step gets one call
    ``cancelled`` for the calls that never ran, so its steps bear the bound out (the tools' names are in the
    model's output, content the bridge never reads). ``asked``: it is the run's last step and the run stopped
    for approval of this call (see :func:`_asked`): the call is ``approval_requested``, added when no tool span
    of it is in the step (Pydantic AI's ``requires_approval`` runs none), so the steps bear the approval out."""
    end_ns = model.end_ns
    for t in calls:
        if t.end_ns > end_ns:
            end_ns = t.end_ns
    tool_calls = tuple([ToolCall(t.tool_id or t.span_id, t.tool_name or "unknown", _status(t)) for t in calls])
    finish = _finish(model, calls)
    if bounded and not calls and (finish == "tool-calls" or (not model.finish and not model.incomplete)):
        tool_calls = (ToolCall(f"{model.span_id}-unrun", "unknown", CANCELLED_STATUS),)
        finish = "tool-calls"
    if asked is not None:
        call_id, name = asked
        if any(c.id == call_id for c in tool_calls):
            tool_calls = tuple([ToolCall(c.id, c.name, "approval_requested") if c.id == call_id else c
                                for c in tool_calls])
        else:
            tool_calls += (ToolCall(call_id, name, "approval_requested"),)
            if not model.finish:
                finish = "tool-calls"
    # positional: run_id, ts, step, finish_reason, segment, tool_calls, usage
    return StepFinished(
        run_id, end_ns // NS_PER_MS, index, finish, segment, tool_calls,
        Usage(model.input_tokens, model.output_tokens, model.total_tokens),
    )


def _ended(run_id: str, row: Runtime, run_span: Span, last_model: Span | None, last_calls: list[Span],
           progress: RunProgress) -> RunEnded:
    """The reported cause (docs/opentelemetry.md, "Reported cause"), first match."""
    base = dict(run_id=run_id, ts=_ms(run_span.end_ns), step_count=progress.steps + progress.late_models,
                segment=progress.segment)
    hook = run_span.hook
    # 0. What the bridge cannot vouch for: spans that came after a later step was published (that step went
    # out without them), or a producer hook attribute it had to refuse. The run is UNCERTAIN: its steps miss
    # what they lost (step_count counts the lost model calls too), and its cause is not the bridge's to give.
    if progress.late_models or progress.late_tools or progress.bad or (hook is not None and hook.bad):
        return RunEnded(**base, cause="unknown", approval=None, error_name=None)
    excs = run_span.exceptions
    shorts = [e.rsplit(".", 1)[-1] for e in excs]
    # 1. an approval deferral (a tool call marked so, or the runtime's interrupt on any span)
    deferred = next((t for t in last_calls if t.approval), None)
    if deferred is None:
        deferred = next((x for x in (run_span, last_model) if x is not None and x.approval), None)
    asked = _asked(run_span) if last_model is not None else None  # the call the last step then holds (_step)
    if hook is not None and hook.cause:  # the producer's record wins over inference
        if hook.cause == "approval_required":
            if deferred is None and asked is None:
                deferred = next((t for t in reversed(last_calls)), None)
            if deferred is None and asked is None:  # no call to tie the approval to: the record cannot be used
                return RunEnded(**base, cause="unknown", approval=None, error_name=None)
        else:
            return RunEnded(**base, cause=hook.cause, fired=hook.fired, approval=None,
                            error_name=shorts[0][:200] if shorts else None)
    if deferred is not None or asked is not None:
        # The approval's marks: the deferred tool span's own, else the run span's (the producer hook puts
        # them there when the approval came to light after the tool span ended)
        own = deferred.hook if deferred is not None else None
        marks = own if own is not None and own.approval_id else hook
        if asked is not None:
            call_id, tool_name = asked
        else:
            call_id, tool_name = deferred.tool_id or deferred.span_id, deferred.tool_name or deferred.name or "unknown"
        if marks is not None and marks.approval_id:
            approval = Approval(approval_id=marks.approval_id, tool_call_id=call_id, tool_name=tool_name,
                                owner=marks.owner or None, deadline_ts=marks.deadline_ts,
                                resume_token=marks.resume_token or None)
        else:
            approval = Approval(approval_id=call_id, tool_call_id=call_id, tool_name=tool_name)
        return RunEnded(**base, cause="approval_required", approval=approval, error_name=None)
    # 2. a bound the runtime enforces by raising
    for exc in excs:
        bound = row.bound_name(exc)
        if bound is not None:
            return RunEnded(**base, cause="stop_condition", fired=(f"custom:{bound}",), approval=None,
                            error_name=exc.rsplit(".", 1)[-1][:200])
    # 3. a timeout, 4. a cancellation: the run span's own first (its timeout beats the cancellation it caused
    # inside), then the last step's model call and tool calls (a runtime may end its run span cleanly after a
    # cancellation cut a tool short)
    inner = [e.rsplit(".", 1)[-1] for x in ([last_model] if last_model else []) + last_calls for e in x.exceptions]
    # (on one span a timeout beats a cancellation too: the cancellation is how the timeout stopped the run).
    # A cancellation a timeout makes as well (row.cancel_or_timeout: Python's CancelledError) is no verdict:
    # the cause is not known, and the exception type says why (the producer hook's record, above, would say).
    for names in (shorts, inner):
        for cause, known in (("timeout", row.timeouts), ("aborted", row.cancelled)):
            hit = next((name for name in names if name in known), None)
            if hit is not None:
                if cause == "aborted" and hit in row.cancel_or_timeout:
                    cause = "unknown"
                return RunEnded(**base, cause=cause, approval=None, error_name=hit[:200])
    if run_span.error:
        error_name = shorts[0][:200] if shorts else None
        # 5. a tool span in ERROR was the last thing that happened
        if progress.last_tool_error:
            return RunEnded(**base, cause="tool_error", approval=None, error_name=error_name)
        # 6. any other error
        return RunEnded(**base, cause="error", approval=None, error_name=error_name)
    if last_model is not None and not last_model.incomplete:
        # 7. a handoff to another agent was the last step's call: the runtime's own completion of this agent
        if row.handoff_tools and last_calls and any(t.tool_name in row.handoff_tools for t in last_calls):
            return RunEnded(**base, cause="stop_condition", fired=(f"custom:{HANDOFF}",), approval=None,
                            error_name=None)
        # 8. ended well, and the last step did not ask for tools
        if _finish(last_model, last_calls) != "tool-calls":
            return RunEnded(**base, cause="natural_finish", approval=None, error_name=None)
    # 9. the cause was not recorded (a model call cut short with nothing recorded included: never a finish)
    return RunEnded(**base, cause="unknown", approval=None, error_name=None)


def expired(state: TraceState, now_ms: int, limits: Limits) -> bool:
    """True when the trace has had no new span for the retention period."""
    return now_ms - state.last_ms >= limits.trace_retention_s * 1000


def unended_runs(state: TraceState) -> int:
    """Runs of the trace that started and never ended."""
    return sum(1 for p in state.runs.values() if p.started and not p.ended)
