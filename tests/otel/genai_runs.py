"""A small agent loop instrumented by hand exactly as the GenAI semantic conventions say (invoke_agent,
chat, execute_tool; error.type; exceptions recorded by the OTel SDK), standing for any conforming runtime
the bridge has no row of its own for. Its model is a script; nothing leaves the process but spans."""

from __future__ import annotations

import asyncio

from opentelemetry.trace import SpanKind

from tests.otel.pydantic_ai_runs import SECRET, Expected

SCOPE = "example.agent-runtime"


class Runtime:
    def __init__(self, provider) -> None:
        self.tracer = provider.get_tracer(SCOPE, "1.2.3")

    async def run(self, agent: str, script: list, tools: dict, max_steps: int = 10) -> None:
        """``script``: per model call, a tool name to call, or None to answer; an exception to raise."""
        with self.tracer.start_as_current_span(f"invoke_agent {agent}", kind=SpanKind.INTERNAL, attributes={
                "gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": agent,
                "gen_ai.input.messages": SECRET}):
            for step, action in enumerate(script[:max_steps]):
                with self.tracer.start_as_current_span("chat scripted", kind=SpanKind.CLIENT, attributes={
                        "gen_ai.operation.name": "chat", "gen_ai.request.model": "scripted",
                        "gen_ai.input.messages": SECRET, "gen_ai.output.messages": SECRET}) as chat:
                    if isinstance(action, BaseException):
                        chat.set_attribute("error.type", type(action).__qualname__)
                        raise action
                    chat.set_attribute("gen_ai.response.finish_reasons", ["tool_calls" if action else "stop"])
                    chat.set_attribute("gen_ai.usage.input_tokens", 100 + step)
                    chat.set_attribute("gen_ai.usage.output_tokens", 20)
                if action is None:
                    return
                with self.tracer.start_as_current_span(f"execute_tool {action}", attributes={
                        "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": action,
                        "gen_ai.tool.call.id": f"call-{step}", "gen_ai.tool.call.arguments": SECRET}) as span:
                    result = await tools[action]()
                    span.set_attribute("gen_ai.tool.call.result", result)


async def _ok() -> str:
    return f"fine {SECRET}"


async def _fails() -> str:
    raise RuntimeError(f"tool failed {SECRET}")


async def _slow() -> str:
    await asyncio.sleep(5)
    return SECRET


async def scenarios(provider) -> list[Expected]:
    rt = Runtime(provider)
    tools = {"lookup": _ok, "boom": _fails, "slow": _slow}
    done = []

    async def attempt(agent, script, **kw):
        try:
            await rt.run(agent, script, tools, **kw)
        except BaseException as exc:  # noqa: BLE001 - what the runtime raised is the fact
            if isinstance(exc, asyncio.CancelledError):
                raise
            return type(exc).__name__
        return None

    done.append(Expected("ga-natural", "VERIFYING", "natural_finish", await attempt("ga-natural", ["lookup", None])))
    done.append(Expected("ga-tool-error", "FAILED", "tool_error", await attempt("ga-tool-error", ["boom", None])))
    done.append(Expected("ga-exception", "FAILED", "error",
                         await attempt("ga-exception", ["lookup", ValueError(SECRET)])))
    # the runtime's own step cap: every span OK, the last step asked for a tool; no span says why it stopped
    done.append(Expected("ga-step-cap", "UNCERTAIN", "cause_not_recorded",
                         await attempt("ga-step-cap", ["lookup"] * 5, max_steps=3), truth="stop_condition"))
    with_timeout = asyncio.wait_for(rt.run("ga-timeout", ["slow", None], tools), 0.2)
    try:
        await with_timeout
        raised = None
    except TimeoutError:
        raised = "TimeoutError"
    # asyncio.wait_for cancels the run, and OpenTelemetry Python does not record a CancelledError (a
    # BaseException): every span ends OK after a step that asked for a tool; the cause was not recorded
    done.append(Expected("ga-timeout", "UNCERTAIN", "cause_not_recorded", raised, truth="timeout"))
    task = asyncio.ensure_future(rt.run("ga-cancelled", ["slow", None], tools))
    await asyncio.sleep(0.2)
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        pass
    done.append(Expected("ga-cancelled", "UNCERTAIN", "cause_not_recorded", "CancelledError", truth="aborted"))
    return done


def run(tracer_provider) -> list[Expected]:
    """Every scenario, exporting through ``tracer_provider``."""
    return asyncio.run(scenarios(tracer_provider))
