"""OpenAI Agents SDK runs on a fake Model (no model calls), traced by
opentelemetry-instrumentation-openai-agents-v2, one per health state the SDK can express."""

from __future__ import annotations

import asyncio
import json
import threading
import time

from agents import Agent, Runner, function_tool, set_trace_processors
from agents.items import ModelResponse
from agents.models.interface import Model
from agents.tracing import generation_span
from agents.usage import Usage
from openai.types.responses import ResponseFunctionToolCall, ResponseOutputMessage, ResponseOutputText

from tests.otel.pydantic_ai_runs import SECRET, Expected

_calls = iter(range(10**9))


def _text(text: str) -> ResponseOutputMessage:
    return ResponseOutputMessage(id=f"msg_{next(_calls)}", type="message", role="assistant", status="completed",
                                 content=[ResponseOutputText(type="output_text", text=text, annotations=[])])


def _tool_call(name: str) -> ResponseFunctionToolCall:
    n = next(_calls)
    return ResponseFunctionToolCall(id=f"fc_{n}", call_id=f"call_{n}", type="function_call", name=name,
                                    arguments=json.dumps({"q": SECRET}), status="completed")


class FakeModel(Model):
    """Calls ``tool`` until ``tool_turns`` model calls were made, then answers (or raises ``fail``)."""

    def __init__(self, tool: str | None = None, tool_turns: int = 1, fail: Exception | None = None,
                 hang_at: int | None = None) -> None:
        self.tool, self.tool_turns, self.fail, self.turn = tool, tool_turns, fail, 0
        self.hang_at = hang_at  # the model call (1-based) that never returns

    async def get_response(self, system_instructions, input, model_settings, tools, output_schema, handoffs,
                           tracing, *, previous_response_id=None, conversation_id=None, prompt=None):
        self.turn += 1
        # a generation span, as the SDK's own models open one around each call
        with generation_span(model="fake-model", model_config={}, input=[{"role": "user", "content": SECRET}],
                             disabled=tracing.is_disabled()) as span:
            if self.fail is not None:
                raise self.fail
            if self.turn == self.hang_at:
                await asyncio.Event().wait()  # until cancelled
            usage = Usage(requests=1, input_tokens=10, output_tokens=5, total_tokens=15)
            if self.tool and self.turn <= self.tool_turns:
                out, finish = [_tool_call(self.tool)], "tool_calls"
            else:
                out, finish = [_text(f"done {SECRET}")], "stop"
            span.span_data.output = [{"role": "assistant", "content": SECRET, "finish_reason": finish}]
            span.span_data.usage = {"input_tokens": 10, "output_tokens": 5}
            return ModelResponse(output=out, usage=usage, response_id=None)

    def stream_response(self, *args, **kwargs):  # the scenarios use Runner.run only
        raise NotImplementedError


@function_tool
def lookup(q: str) -> str:
    """Look something up."""
    return f"found {SECRET}"


@function_tool
def boom(q: str) -> str:
    """Fail."""
    raise RuntimeError(f"tool failed {SECRET}")


@function_tool
async def hang(q: str) -> str:
    """Take a long time."""
    await asyncio.sleep(5)
    return f"late {SECRET}"


@function_tool(needs_approval=True)
def delete(q: str) -> str:
    """Delete something, after approval."""
    return f"deleted {SECRET}"


async def _run(agent: Agent, **kw) -> str | None:
    try:
        await Runner.run(agent, f"task {SECRET}", **kw)
    except BaseException as exc:  # noqa: BLE001 - what the framework raised is the fact
        if isinstance(exc, asyncio.CancelledError):
            raise
        return type(exc).__name__
    return None


async def scenarios(tracer_provider) -> list[Expected]:
    from opentelemetry.instrumentation.openai_agents import OpenAIAgentsInstrumentor

    set_trace_processors([])  # no export to OpenAI's tracing backend: only the OTel bridge
    instrumentor = OpenAIAgentsInstrumentor()
    instrumentor.instrument(tracer_provider=tracer_provider, capture_message_content=True)
    try:
        done = []
        a = Agent(name="oa-natural", model=FakeModel("lookup"), tools=[lookup])
        done.append(Expected("oa-natural", "VERIFYING", "natural_finish", await _run(a)))
        # the SDK hands a tool's error back to the model, which answers: a natural finish (1 tool error in evidence)
        a = Agent(name="oa-tool-error", model=FakeModel("boom"), tools=[boom])
        done.append(Expected("oa-tool-error", "VERIFYING", "natural_finish", await _run(a)))
        # needs_approval interrupts the run; no span says so (its execute_tool span ends OK): not recorded
        a = Agent(name="oa-approval", model=FakeModel("delete"), tools=[delete])
        done.append(Expected("oa-approval", "UNCERTAIN", "cause_not_recorded", await _run(a),
                             truth="approval_required"))
        a = Agent(name="oa-cancelled", model=FakeModel("hang"), tools=[hang])
        task = asyncio.ensure_future(_run(a))
        await asyncio.sleep(0.3)
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass
        await asyncio.sleep(0.2)  # the cancelled tool's span ends (OK, no error) after the run's
        # the application cancels the task: every span ends OK, the last step asked for a tool: not recorded
        done.append(Expected("oa-cancelled", "UNCERTAIN", "cause_not_recorded", "CancelledError", truth="aborted"))
        a = Agent(name="oa-bounded", model=FakeModel("lookup", tool_turns=99), tools=[lookup])
        done.append(Expected("oa-bounded", "BOUNDED_STOP", "stop_condition", await _run(a, max_turns=3)))
        a = Agent(name="oa-exception", model=FakeModel(fail=ValueError(f"provider exploded {SECRET}")))
        done.append(Expected("oa-exception", "FAILED", "error", await _run(a)))
        # cancelled during its second model call: that chat span ends with no response attribute, every span
        # OK: the cause was not recorded, never a natural finish
        a = Agent(name="oa-model-cancelled", model=FakeModel("lookup", hang_at=2), tools=[lookup])
        task = asyncio.ensure_future(_run(a))
        await asyncio.sleep(0.3)
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass
        done.append(Expected("oa-model-cancelled", "UNCERTAIN", "cause_mismatch", "CancelledError", truth="aborted"))
        # a handoff: the handing-off agent's part ends as a handoff (a completion), the target's run its own
        target = Agent(name="oa-handoff-target", model=FakeModel())
        a = Agent(name="oa-handoff", model=FakeModel("transfer_to_oa_handoff_target"), handoffs=[target])
        done.append(Expected("oa-handoff", "VERIFYING", "stop_condition", await _run(a)))
        done.append(Expected("oa-handoff-target", "VERIFYING", "natural_finish", None))

        return done
    finally:
        instrumentor.uninstrument()


def hung(tracer_provider, finished) -> tuple[Expected, list]:
    """A run hung in its second model call, and the spans that ended while it hangs (``finished()``), read
    before the instrumentation's shutdown ends its open spans ("Application shutdown")."""
    from opentelemetry.instrumentation.openai_agents import OpenAIAgentsInstrumentor

    set_trace_processors([])
    instrumentor = OpenAIAgentsInstrumentor()
    instrumentor.instrument(tracer_provider=tracer_provider)
    try:
        agent = Agent(name="oa-hung", model=FakeModel("lookup", hang_at=2), tools=[lookup])
        # on a loop of its own in a thread, hung until the spans are read, then cancelled so the test ends
        loop = asyncio.new_event_loop()
        task = loop.create_task(_run(agent))

        def hang() -> None:
            try:
                loop.run_until_complete(task)
            except asyncio.CancelledError:
                pass

        thread = threading.Thread(target=hang, daemon=True)
        thread.start()
        time.sleep(1.0)
        spans = list(finished())
        loop.call_soon_threadsafe(task.cancel)
        thread.join(10)
        loop.close()
    finally:
        instrumentor.uninstrument()
    # it starts at its first turn's spans and goes STUCK after the inactivity timeout; only the agent span
    # names the agent, so it starts under the runtime's name
    return Expected("openai-agents", "STUCK", "no_progress", None, truth="hung"), spans


def run(tracer_provider) -> list[Expected]:
    """Every scenario, exporting through ``tracer_provider``."""
    return asyncio.run(scenarios(tracer_provider))
