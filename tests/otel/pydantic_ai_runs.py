"""Pydantic AI runs, one per health state it can express, on its own test models (no model calls).

Each scenario runs a real ``pydantic_ai.Agent`` (instrumented with the tracer provider it is
given) and returns what the framework did, for the bridge's events to be checked against.
A secret is planted in every piece of content (prompt, model text, tool arguments and results).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from opentelemetry.sdk.trace import SpanProcessor
from pydantic_ai import Agent, DeferredToolRequests, RunContext
from pydantic_ai.exceptions import AgentRunError, ApprovalRequired
from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.models.instrumented import InstrumentationSettings
from pydantic_ai.usage import UsageLimits

SECRET = "s3cr3t-PLANTED-0xC0FFEE"


@dataclass(frozen=True)
class Expected:
    agent: str
    state: str  # final health state
    reason: str  # the reason of the last transition (the reported cause's reason code)
    raised: str | None  # what the framework raised to the caller
    truth: str | None = None  # the framework's own cause where the spans cannot show it (a disagreement)


def _calls_tool(tool: str, then_text: bool = True):
    def model(messages, info: AgentInfo) -> ModelResponse:
        # finish reasons as a provider model records them (the test models record none by themselves)
        if then_text and len(messages) > 1:
            return ModelResponse(parts=[TextPart(f"done {SECRET}")], finish_reason="stop")
        return ModelResponse(parts=[ToolCallPart(tool, {"q": SECRET})], finish_reason="tool_call")
    return model


def _failing_model(messages, info: AgentInfo) -> ModelResponse:
    raise ValueError(f"provider exploded {SECRET}")


async def _run(agent: Agent, **kw) -> str | None:
    try:
        await agent.run(f"task {SECRET}", **kw)
    except (AgentRunError, Exception) as exc:  # noqa: BLE001 - what the framework raised is the fact
        return type(exc).__name__
    return None


class _Marks(SpanProcessor):
    """The producer hook's part, by hand: ``run_id`` on every span at its start, the last run span kept."""

    run_id: str | None = None
    root = None

    def on_start(self, span, parent_context=None) -> None:
        if self.run_id is None:
            return
        span.set_attribute("loopwarden.run.id", self.run_id)
        if span.name.startswith("invoke_agent"):
            self.root = span


marks = _Marks()


async def scenarios(settings: InstrumentationSettings) -> list[Expected]:
    """Run every scenario once; returns the expectations, in run order."""
    Agent.instrument_all(settings)
    done: list[Expected] = []

    natural = Agent(FunctionModel(_calls_tool("lookup")), name="pa-natural")

    @natural.tool_plain
    def lookup(q: str) -> str:
        return f"found {SECRET}"

    done.append(Expected("pa-natural", "VERIFYING", "natural_finish", await _run(natural)))

    tool_error = Agent(FunctionModel(_calls_tool("boom")), name="pa-tool-error")

    @tool_error.tool_plain
    def boom(q: str) -> str:
        raise RuntimeError(f"tool failed {SECRET}")

    done.append(Expected("pa-tool-error", "FAILED", "tool_error", await _run(tool_error)))

    approval = Agent(FunctionModel(_calls_tool("delete", then_text=False)), name="pa-approval",
                     output_type=[str, DeferredToolRequests])

    @approval.tool_plain
    def delete(q: str) -> str:
        raise ApprovalRequired()  # the tool span carries pydantic_ai.tool.deferral.name

    done.append(Expected("pa-approval", "WAITING_UNROUTED", "approval_required", await _run(approval)))

    # requires_approval=True defers before any tool span: no span says so, so the cause is not recorded
    # (reported unknown; the steps show a last step without tool calls, derived natural_finish: a mismatch)
    unmarked = Agent(FunctionModel(_calls_tool("remove", then_text=False)), name="pa-approval-unmarked",
                     output_type=[str, DeferredToolRequests])

    @unmarked.tool_plain(requires_approval=True)
    def remove(q: str) -> str:
        return f"removed {SECRET}"

    done.append(Expected("pa-approval-unmarked", "UNCERTAIN", "cause_mismatch", await _run(unmarked),
                         truth="approval_required"))

    bounded = Agent(FunctionModel(_calls_tool("again", then_text=False)), name="pa-bounded")

    @bounded.tool_plain
    def again(q: str) -> str:
        return f"more {SECRET}"

    done.append(Expected("pa-bounded", "BOUNDED_STOP", "stop_condition",
                         await _run(bounded, usage_limits=UsageLimits(request_limit=3))))

    cancelled = Agent(FunctionModel(_calls_tool("stop_here")), name="pa-cancelled")

    @cancelled.tool
    def stop_here(ctx: RunContext, q: str) -> str:
        ctx.cancel()
        return f"never {SECRET}"

    # RunCancelled is not recorded on any span (the run span ends OK): the cause was not recorded
    done.append(Expected("pa-cancelled", "UNCERTAIN", "cause_not_recorded", await _run(cancelled), truth="aborted"))

    slow = Agent(FunctionModel(_calls_tool("wait")), name="pa-timeout")

    @slow.tool_plain
    async def wait(q: str) -> str:
        await asyncio.sleep(5)
        return f"late {SECRET}"

    # RunTimedOut reaches the caller only: the tool span records the CancelledError that a cancel of the task
    # records too, and the run span nothing. The spans cannot tell a timeout from a cancel: UNCERTAIN
    done.append(Expected("pa-timeout", "UNCERTAIN", "cause_not_recorded", await _run(slow, timeout=0.3),
                         truth="timeout"))

    killed = Agent(FunctionModel(_calls_tool("hang")), name="pa-task-cancelled")

    @killed.tool_plain
    async def hang(q: str) -> str:
        await asyncio.sleep(5)
        return f"late {SECRET}"

    # the application cancels the task running the agent: CancelledError on the tool span, as a timeout gives
    task = asyncio.ensure_future(_run(killed))
    await asyncio.sleep(0.3)
    task.cancel()
    try:
        await task
        raised = None
    except asyncio.CancelledError:
        raised = "CancelledError"
    done.append(Expected("pa-task-cancelled", "UNCERTAIN", "cause_not_recorded", raised, truth="aborted"))

    async def slow_second_call(messages, info: AgentInfo) -> ModelResponse:
        if len(messages) > 1:
            await asyncio.sleep(5)
        return ModelResponse(parts=[ToolCallPart("lookup", {"q": SECRET})], finish_reason="tool_call")

    model_cancelled = Agent(FunctionModel(slow_second_call), name="pa-model-cancelled")

    @model_cancelled.tool_plain
    def lookup(q: str) -> str:  # noqa: F811 - one tool of each scenario's agent
        return f"found {SECRET}"

    # the task is cancelled during the second model call: that chat span ends with no response attribute and
    # nothing records the cancellation (the run span ends UNSET): the cause was not recorded, never a finish
    task = asyncio.ensure_future(_run(model_cancelled))
    await asyncio.sleep(0.3)
    task.cancel()
    try:
        await task
        raised = None
    except asyncio.CancelledError:
        raised = "CancelledError"
    done.append(Expected("pa-model-cancelled", "UNCERTAIN", "cause_mismatch", raised, truth="aborted"))

    # the same, with the producer's record set by hand as the hook does: the run id on every span at its
    # start, the cause on the run span before the application cancels it
    hooked = Agent(FunctionModel(slow_second_call), name="pa-model-cancelled-hooked")

    @hooked.tool_plain
    def lookup(q: str) -> str:  # noqa: F811
        return f"found {SECRET}"

    marks.run_id = "pa-order-7"
    task = asyncio.ensure_future(_run(hooked))
    await asyncio.sleep(0.3)
    marks.root.set_attribute("loopwarden.stop.cause", "aborted")
    task.cancel()
    try:
        await task
        raised = None
    except asyncio.CancelledError:
        raised = "CancelledError"
    marks.run_id = None
    done.append(Expected("pa-model-cancelled-hooked", "BOUNDED_STOP", "aborted", raised))

    # limits checked after the model asked for tools and before they ran: the last step gets one call
    # `cancelled` for them, so the steps bear the bound out
    two_calls = Agent(FunctionModel(lambda messages, info: ModelResponse(
        parts=[ToolCallPart("lookup", {"q": SECRET}), ToolCallPart("lookup", {"q": SECRET})],
        finish_reason="tool_call")), name="pa-tool-calls-limit")

    @two_calls.tool_plain
    def lookup(q: str) -> str:  # noqa: F811
        return f"found {SECRET}"

    done.append(Expected("pa-tool-calls-limit", "BOUNDED_STOP", "stop_condition",
                         await _run(two_calls, usage_limits=UsageLimits(tool_calls_limit=3))))

    tokens = Agent(FunctionModel(_calls_tool("lookup", then_text=False)), name="pa-tokens-limit")

    @tokens.tool_plain
    def lookup(q: str) -> str:  # noqa: F811
        return f"found {SECRET}"

    done.append(Expected("pa-tokens-limit", "BOUNDED_STOP", "stop_condition",
                         await _run(tokens, usage_limits=UsageLimits(total_tokens_limit=150))))

    failing = Agent(FunctionModel(_failing_model), name="pa-exception")
    done.append(Expected("pa-exception", "FAILED", "error", await _run(failing)))
    return done


def run(tracer_provider) -> list[Expected]:
    """Every scenario, exporting through ``tracer_provider``."""
    from pydantic_ai.models.instrumented import InstrumentationSettings

    tracer_provider.add_span_processor(marks)
    return asyncio.run(scenarios(InstrumentationSettings(tracer_provider=tracer_provider)))
