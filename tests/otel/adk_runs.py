"""Google ADK agents on a fake model (a ``BaseLlm`` of our own: no model calls), traced by ADK's own
OpenTelemetry spans (tracer ``gcp.vertex.agent``), one per health state ADK can express.

ADK takes its tracer from the global tracer provider once, at import; the global provider can be set
only once per process. So the global provider here is a switch (OpenTelemetry's public API only) that
hands each new span to the provider the scenarios were given.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager

from opentelemetry import trace

from tests.otel.pydantic_ai_runs import SECRET, Expected


class _SwitchTracer(trace.Tracer):
    def __init__(self, switch: _Switch, args: tuple, kwargs: dict) -> None:
        self.switch, self.args, self.kwargs = switch, args, kwargs

    def _real(self) -> trace.Tracer:
        return self.switch.target.get_tracer(*self.args, **self.kwargs)

    def start_span(self, *args, **kwargs) -> trace.Span:
        return self._real().start_span(*args, **kwargs)

    @contextmanager
    def start_as_current_span(self, *args, **kwargs) -> Iterator[trace.Span]:
        with self._real().start_as_current_span(*args, **kwargs) as span:
            yield span


class _Switch(trace.TracerProvider):
    """The process's global tracer provider: every tracer it gives starts its spans on ``target``."""

    def __init__(self) -> None:
        self.target: trace.TracerProvider = trace.NoOpTracerProvider()

    def get_tracer(self, *args, **kwargs) -> trace.Tracer:
        return _SwitchTracer(self, args, kwargs)


_switch = _Switch()


def _use(tracer_provider) -> None:
    if not isinstance(trace.get_tracer_provider(), _Switch):
        trace.set_tracer_provider(_switch)
    _switch.target = tracer_provider


def _fake_llm(tool: str | None = None, turns: int = 1, args: dict | None = None, fail: Exception | None = None,
              hang: bool = False):
    from google.adk.models.base_llm import BaseLlm
    from google.adk.models.llm_response import LlmResponse
    from google.genai import types

    class FakeLlm(BaseLlm):
        """Calls ``tool`` for ``turns`` model calls, then answers (or raises ``fail``)."""

        calls: int = 0

        async def generate_content_async(self, llm_request, stream: bool = False):
            self.calls += 1
            if hang:
                await asyncio.Event().wait()  # never returns: until cancelled
            if fail is not None:
                raise fail
            if tool and self.calls <= turns:
                part = types.Part(function_call=types.FunctionCall(
                    name=tool, args=args if args is not None else {"q": SECRET}, id=f"call-{self.calls}"))
            else:
                part = types.Part(text=f"done {SECRET}")
            usage = types.GenerateContentResponseUsageMetadata(prompt_token_count=10, candidates_token_count=5,
                                                              total_token_count=15)
            yield LlmResponse(content=types.Content(role="model", parts=[part]),
                              finish_reason=types.FinishReason.STOP, usage_metadata=usage)

    return FakeLlm(model="fake-model")


def lookup(q: str) -> str:
    """Look something up."""
    return f"found {SECRET}"


async def _run(agent, **kw) -> str | None:
    from google.adk.runners import InMemoryRunner
    from google.genai import types

    runner = InMemoryRunner(agent=agent, app_name="loopwarden-test")
    session = await runner.session_service.create_session(app_name="loopwarden-test", user_id="u")
    message = types.Content(role="user", parts=[types.Part(text=f"task {SECRET}")])
    try:
        async for _event in runner.run_async(user_id="u", session_id=session.id, new_message=message, **kw):
            pass
    except Exception as exc:  # noqa: BLE001 - what the framework raised is the fact
        return type(exc).__name__
    return None


async def scenarios() -> list[Expected]:
    from google.adk.agents import LlmAgent
    from google.adk.agents.run_config import RunConfig

    done = []
    a = LlmAgent(name="adk_natural", model=_fake_llm("lookup"), tools=[lookup])
    done.append(Expected("adk_natural", "VERIFYING", "natural_finish", await _run(a)))
    # max_llm_calls: LlmCallsLimitExceededError before the fourth model call, after the third step's tools ran
    a = LlmAgent(name="adk_max_llm_calls", model=_fake_llm("lookup", turns=99), tools=[lookup])
    done.append(Expected("adk_max_llm_calls", "BOUNDED_STOP", "stop_condition",
                         await _run(a, run_config=RunConfig(max_llm_calls=3))))
    # transfer_to_agent: the handing-off agent's part ends as a handoff (a completion); the target's is a run
    target = LlmAgent(name="adk_target", model=_fake_llm())
    a = LlmAgent(name="adk_transfer", model=_fake_llm("transfer_to_agent", args={"agent_name": "adk_target"}),
                 sub_agents=[target])
    done.append(Expected("adk_transfer", "VERIFYING", "stop_condition", await _run(a)))
    done.append(Expected("adk_target", "VERIFYING", "natural_finish", None))
    a = LlmAgent(name="adk_exception", model=_fake_llm(fail=ValueError(f"provider exploded {SECRET}")))
    done.append(Expected("adk_exception", "FAILED", "error", await _run(a)))
    return done


def run(tracer_provider) -> list[Expected]:
    """Every scenario, exporting through ``tracer_provider``."""
    _use(tracer_provider)
    try:
        return asyncio.run(scenarios())
    finally:
        _switch.target = trace.NoOpTracerProvider()
