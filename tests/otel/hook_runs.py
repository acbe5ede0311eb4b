"""The stops a runtime's spans cannot tell, on the real runtimes, each run twice: as an application
writes it with loopwarden's producer hook (loopwarden.stages.otel.hook), and the same code without it.

Every scenario function takes ``hooked`` and returns a :class:`Case`: the agent it ran (suffixed
``-hook`` or ``-bare``) and the state the bridge must reach. With the hook that is the state the
runtime's own semantics give (a cancel is BOUNDED_STOP aborted, a timeout STUCK timeout, an
approval WAITING_UNROUTED or WAITING once routed, a stop condition what its role says); without it,
the state of what the spans can tell. The provider given must export through ``hook.RunSpans``
(it changes nothing for spans outside a run scope, so the bare runs see a plain exporter).
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass

from pydantic_ai import Agent, DeferredToolRequests, RunContext
from pydantic_ai.exceptions import RunCancelled
from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import FunctionModel

from loopwarden.stages.otel import hook
from tests.otel.pydantic_ai_runs import SECRET

# what routes an approval (WAITING rather than WAITING_UNROUTED): an owner, a deadline, a resume token
ROUTE = {"owner": "ops-oncall", "deadline_ts": 4_102_444_800_000, "resume_token": "resume-1"}


@dataclass(frozen=True)
class Case:
    agent: str
    state: str  # final health state
    reason: str | None = None  # the last transition's reason, where it is the runtime's own cause


def _scope(hooked: bool, **kw):
    return hook.run(**kw) if hooked else contextlib.nullcontext()


def _name(base: str, hooked: bool) -> str:
    sep = "_" if "_" in base else "-"  # ADK agent names must be Python identifiers
    return f"{base}{sep}{'hook' if hooked else 'bare'}"


async def _cancel_after(aw, hooked: bool, delay_s: float = 0.3) -> None:
    """The application cancels the run's task while a tool or model call is running."""
    task = hook.start_run(aw) if hooked else asyncio.ensure_future(aw)
    await asyncio.sleep(delay_s)
    if hooked:
        hook.cancel_run(task)
    else:
        task.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await task
    await asyncio.sleep(0.2)  # a cut-short tool's span ends after the run's


async def _timeout(aw, hooked: bool, timeout_s: float = 0.3) -> None:
    """The application bounds the run's wall time (run_with_timeout, or asyncio.wait_for without the hook)."""
    with contextlib.suppress(TimeoutError):
        if hooked:
            await hook.run_with_timeout(aw, timeout_s)
        else:
            await asyncio.wait_for(aw, timeout_s)
    await asyncio.sleep(0.2)


# -- Pydantic AI -----------------------------------------------------------------------------------------
async def pydantic_ai(settings) -> list[Case]:
    Agent.instrument_all(settings)

    def calls(tool: str, then_text: bool = True):
        def model(messages, info) -> ModelResponse:
            if then_text and len(messages) > 1:
                return ModelResponse(parts=[TextPart(f"done {SECRET}")], finish_reason="stop")
            return ModelResponse(parts=[ToolCallPart(tool, {"q": SECRET})], finish_reason="tool_call")
        return model

    async def slow_model(messages, info) -> ModelResponse:
        await asyncio.sleep(5)
        return ModelResponse(parts=[TextPart(f"late {SECRET}")], finish_reason="stop")

    def agent(base: str, hooked: bool, model, **kw):
        return Agent(model, name=_name(base, hooked), **kw)

    done: list[Case] = []
    for hooked in (True, False):
        a = agent("pa-cancel-tool", hooked, FunctionModel(calls("hang")))

        @a.tool_plain
        async def hang(q: str) -> str:
            await asyncio.sleep(5)
            return f"late {SECRET}"

        await _cancel_after(a.run(f"task {SECRET}"), hooked)
        # the tool span records a CancelledError, as it does when a timeout cancels the run: only the hook tells
        done.append(Case(a.name, "BOUNDED_STOP", "aborted") if hooked else Case(a.name, "UNCERTAIN", "cause_not_recorded"))

        a = agent("pa-cancel-model", hooked, FunctionModel(slow_model))
        await _cancel_after(a.run(f"task {SECRET}"), hooked)
        # cut short in a model call, the run span ends OK with no exception: an incomplete call, not a finish
        done.append(Case(a.name, "BOUNDED_STOP", "aborted") if hooked else Case(a.name, "UNCERTAIN"))

        a = agent("pa-cancel-in-tool", hooked, FunctionModel(calls("stop_here")))

        @a.tool
        def stop_here(ctx: RunContext, q: str) -> str:
            ctx.cancel()
            return f"never {SECRET}"

        # RunCancelled reaches the caller after every span ended OK: only the scope sees it
        with contextlib.suppress(RunCancelled), _scope(hooked):
            await a.run(f"task {SECRET}")
        done.append(Case(a.name, "BOUNDED_STOP", "aborted") if hooked else Case(a.name, "UNCERTAIN"))

        a = agent("pa-timeout", hooked, FunctionModel(calls("wait")))

        @a.tool_plain
        async def wait(q: str) -> str:
            await asyncio.sleep(5)
            return f"late {SECRET}"

        await _timeout(a.run(f"task {SECRET}"), hooked)
        # without the hook the spans show the cancellation the timeout made, which a cancel makes too: UNCERTAIN
        done.append(Case(a.name, "STUCK", "timeout") if hooked else Case(a.name, "UNCERTAIN", "cause_not_recorded"))

        a = agent("pa-own-timeout", hooked, FunctionModel(calls("wait2")))

        @a.tool_plain
        async def wait2(q: str) -> str:
            await asyncio.sleep(5)
            return f"late {SECRET}"

        with contextlib.suppress(RunCancelled), _scope(hooked):
            await a.run(f"task {SECRET}", timeout=0.3)
        await asyncio.sleep(0.2)
        # Pydantic AI's own timeout: RunTimedOut reaches the caller only (the scope), the spans as for a cancel
        done.append(Case(a.name, "STUCK", "timeout") if hooked else Case(a.name, "UNCERTAIN", "cause_not_recorded"))

        for routed in (False, True):
            a = agent("pa-approval" + ("-routed" if routed else ""), hooked,
                      FunctionModel(calls("remove", then_text=False)), output_type=[str, DeferredToolRequests])

            @a.tool_plain(requires_approval=True)
            def remove(q: str) -> str:
                return f"removed {SECRET}"

            with _scope(hooked) as run:
                result = await a.run(f"task {SECRET}")
                if hooked:  # the deferred output names the calls awaiting approval
                    call = result.output.approvals[0]
                    route = ROUTE if routed else {}
                    run.mark_approval(call.tool_call_id, call.tool_name, **route)
            if hooked:
                done.append(Case(a.name, "WAITING" if routed else "WAITING_UNROUTED", "approval_required"))
            else:
                done.append(Case(a.name, "UNCERTAIN"))

        # the application's own step budget, checked while iterating the run: it stops without raising
        a = agent("pa-app-budget", hooked, FunctionModel(calls("again", then_text=False)))

        @a.tool_plain
        def again(q: str) -> str:
            return f"more {SECRET}"

        policy = {"version": "app-budget@1", "stop_when": [{"kind": "custom", "name": "step_budget", "role": "bound"}]}
        with _scope(hooked, policy=policy) as run:
            async with a.iter(f"task {SECRET}") as agent_run:
                models = 0
                async for node in agent_run:
                    if Agent.is_model_request_node(node):
                        models += 1
                        if models > 2:
                            if hooked:
                                run.stop_condition(["custom:step_budget"])
                            break
        done.append(Case(a.name, "BOUNDED_STOP", "stop_condition") if hooked else Case(a.name, "UNCERTAIN"))
    return done


def run_pydantic_ai(tracer_provider) -> list[Case]:
    from pydantic_ai.models.instrumented import InstrumentationSettings

    return asyncio.run(pydantic_ai(InstrumentationSettings(tracer_provider=tracer_provider)))


# -- OpenAI Agents SDK -----------------------------------------------------------------------------------
async def openai_agents(tracer_provider) -> list[Case]:
    from agents import Agent as OAAgent, Runner, set_trace_processors
    from opentelemetry.instrumentation.openai_agents import OpenAIAgentsInstrumentor

    from tests.otel.openai_agents_runs import FakeModel, delete, hang, lookup

    set_trace_processors([])  # no export to OpenAI's tracing backend: only the OTel bridge
    instrumentor = OpenAIAgentsInstrumentor()
    instrumentor.instrument(tracer_provider=tracer_provider)
    done: list[Case] = []
    try:
        for hooked in (True, False):
            a = OAAgent(name=_name("oa-cancel", hooked), model=FakeModel("hang"), tools=[hang])
            await _cancel_after(Runner.run(a, f"task {SECRET}"), hooked)
            done.append(Case(a.name, "BOUNDED_STOP", "aborted") if hooked else Case(a.name, "UNCERTAIN"))

            a = OAAgent(name=_name("oa-timeout", hooked), model=FakeModel("hang"), tools=[hang])
            await _timeout(Runner.run(a, f"task {SECRET}"), hooked)
            done.append(Case(a.name, "STUCK", "timeout") if hooked else Case(a.name, "UNCERTAIN"))

            for routed in (False, True):
                a = OAAgent(name=_name("oa-approval" + ("-routed" if routed else ""), hooked),
                          model=FakeModel("delete"), tools=[delete])
                with _scope(hooked) as run:
                    result = await Runner.run(a, f"task {SECRET}")
                    if hooked:  # the run returned with the calls awaiting approval
                        item = result.interruptions[0]
                        route = ROUTE if routed else {}
                        run.mark_approval(item.call_id, item.tool_name, **route)
                if hooked:
                    done.append(Case(a.name, "WAITING" if routed else "WAITING_UNROUTED", "approval_required"))
                else:
                    done.append(Case(a.name, "UNCERTAIN"))

            # StopAtTools: the named tool's output is the final output (a completion condition), no raise
            policy = {"version": "stop-at-tools@1",
                      "stop_when": [{"kind": "custom", "name": "stop_at_tools", "role": "completion"}]}
            a = OAAgent(name=_name("oa-stop-at-tools", hooked), model=FakeModel("lookup", tool_turns=99),
                      tools=[lookup], tool_use_behavior={"stop_at_tool_names": ["lookup"]})
            with _scope(hooked, policy=policy) as run:
                result = await Runner.run(a, f"task {SECRET}")
                if hooked:
                    run.stop_condition(["custom:stop_at_tools"])
            done.append(Case(a.name, "VERIFYING", "stop_condition") if hooked else Case(a.name, "UNCERTAIN"))
        return done
    finally:
        instrumentor.uninstrument()


def run_openai_agents(tracer_provider) -> list[Case]:
    return asyncio.run(openai_agents(tracer_provider))


# -- LangGraph (OpenInference) ----------------------------------------------------------------------------
async def langgraph(tracer_provider) -> list[Case]:
    from langchain_core.tools import tool
    from langgraph.checkpoint.memory import InMemorySaver

    from tests.otel.langgraph_runs import _agent, _answer, _calls, delete, lookup

    @tool
    async def hang(q: str) -> str:
        """Take a long time."""
        await asyncio.sleep(5)
        return f"late {SECRET}"

    done: list[Case] = []
    for hooked in (True, False):
        msgs = {"messages": [("user", f"task {SECRET}")]}
        a = _agent(_name("lg-cancel", hooked), [_calls("hang"), _answer()], [hang])
        await _cancel_after(a.ainvoke(msgs), hooked)
        # OpenInference records the CancelledError, as for a timeout's cancel: only the hook tells
        done.append(Case(a.name, "BOUNDED_STOP", "aborted") if hooked else Case(a.name, "UNCERTAIN", "cause_not_recorded"))

        a = _agent(_name("lg-timeout", hooked), [_calls("hang"), _answer()], [hang])
        await _timeout(a.ainvoke(msgs), hooked)
        done.append(Case(a.name, "STUCK", "timeout") if hooked else Case(a.name, "UNCERTAIN", "cause_not_recorded"))

        # interrupt() is recorded (GraphInterrupt): the hook adds the routing the spans never carry
        a = _agent(_name("lg-approval-routed", hooked), [_calls("delete"), _answer()], [delete],
                   checkpointer=InMemorySaver())
        with _scope(hooked) as run:
            result = await a.ainvoke(msgs, {"configurable": {"thread_id": a.name}})
            if hooked:
                call = result["messages"][-1].tool_calls[0]
                run.mark_approval(call["id"], call["name"], **ROUTE)
        done.append(Case(a.name, "WAITING" if hooked else "WAITING_UNROUTED", "approval_required"))

        # create_react_agent at an even recursion_limit stops by itself ("need more steps"), raising nothing
        policy = {"version": "langgraph@1",
                  "stop_when": [{"kind": "custom", "name": "recursion_limit", "role": "bound"}]}
        a = _agent(_name("lg-react-bounded-quiet", hooked), [_calls("lookup") for _ in range(20)], [lookup])
        with _scope(hooked, policy=policy) as run:
            result = await a.ainvoke(msgs, {"recursion_limit": 4})
            last = result["messages"][-1]
            if hooked and not last.tool_calls and "need more steps" in str(last.content):
                run.stop_condition(["custom:recursion_limit"])
        done.append(Case(a.name, "BOUNDED_STOP", "stop_condition") if hooked else Case(a.name, "UNCERTAIN"))
    return done


def run_langgraph(tracer_provider) -> list[Case]:
    from openinference.instrumentation.langchain import LangChainInstrumentor

    instrumentor = LangChainInstrumentor()
    instrumentor.instrument(tracer_provider=tracer_provider)
    try:
        return asyncio.run(langgraph(tracer_provider))
    finally:
        instrumentor.uninstrument()


# -- Google ADK ---------------------------------------------------------------------------------------------
async def adk() -> list[Case]:
    from typing import AsyncGenerator

    from google.adk.agents import LlmAgent
    from google.adk.models.base_llm import BaseLlm
    from google.adk.models.llm_response import LlmResponse
    from google.adk.runners import InMemoryRunner
    from google.adk.tools import FunctionTool
    from google.genai import types

    class FakeLlm(BaseLlm):
        """Calls ``tool`` once, then answers (no model calls)."""

        tool: str = ""

        async def generate_content_async(self, llm_request, stream=False) -> AsyncGenerator[LlmResponse, None]:
            answered = any(p.function_response for c in llm_request.contents for p in (c.parts or []))
            if self.tool and not answered:
                part = types.Part.from_function_call(name=self.tool, args={"q": SECRET})
            else:
                part = types.Part.from_text(text=f"done {SECRET}")
            yield LlmResponse(content=types.Content(role="model", parts=[part]), finish_reason=types.FinishReason.STOP)

    def delete(q: str) -> str:
        """Delete something, after a human confirms."""
        return f"deleted {SECRET}"

    async def hang(q: str) -> str:
        """Take a long time."""
        await asyncio.sleep(5)
        return f"late {SECRET}"

    async def start(name: str, tool: str, tools: list):
        runner = InMemoryRunner(agent=LlmAgent(name=name, model=FakeLlm(model="fake", tool=tool), tools=tools),
                                app_name="app")
        session = await runner.session_service.create_session(app_name="app", user_id="u")
        message = types.Content(role="user", parts=[types.Part.from_text(text=f"task {SECRET}")])
        return runner.run_async(user_id="u", session_id=session.id, new_message=message)

    async def drain(events) -> None:
        async for _ in events:
            pass

    done: list[Case] = []
    for hooked in (True, False):
        name = _name("adk_cancel", hooked)
        await _cancel_after(drain(await start(name, "hang", [hang])), hooked)
        done.append(Case(name, "BOUNDED_STOP", "aborted") if hooked else Case(name, "UNCERTAIN"))

        name = _name("adk_timeout", hooked)
        await _timeout(drain(await start(name, "hang", [hang])), hooked)
        done.append(Case(name, "STUCK", "timeout") if hooked else Case(name, "UNCERTAIN"))

        for routed in (False, True):
            name = _name("adk_approval" + ("_routed" if routed else ""), hooked)
            events = await start(name, "delete", [FunctionTool(delete, require_confirmation=True)])
            with _scope(hooked) as run:
                async for event in events:  # the confirmation request names the call it holds back
                    for call in event.get_function_calls():
                        if hooked and call.name == "adk_request_confirmation":
                            held = call.args["originalFunctionCall"]
                            route = ROUTE if routed else {}
                            run.mark_approval(held["id"], held["name"], **route)
            if hooked:
                done.append(Case(name, "WAITING" if routed else "WAITING_UNROUTED", "approval_required"))
            else:
                done.append(Case(name, "UNCERTAIN"))
    return done


def run_adk(tracer_provider) -> list[Case]:
    """Every ADK scenario; ADK traces through the global tracer provider, switched to ``tracer_provider``."""
    from tests.otel.adk_runs import _use

    _use(tracer_provider)
    return asyncio.run(adk())


# -- a run hung in its very first model call ----------------------------------------------------------------
async def _hung(aw, hooked: bool, run_id: str, finished, **kw) -> list:
    """``aw`` (a run whose first model call never returns) started, hooked or not (``kw``: the scope's other
    arguments); the spans exported while it hangs; then it is cancelled, so the test ends."""
    task = hook.start_run(aw, run_id, **kw) if hooked else asyncio.ensure_future(aw)
    await asyncio.sleep(0.5)
    spans = list(finished())
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await task
    return spans


def hung_first_call(runtime: str, tracer_provider, finished, hooked: bool) -> tuple[str, list]:
    """``runtime``'s run hung in its first model call: (its agent's name, the spans exported while it hangs).
    Nothing of the run has ended: only the hook's start marker, if hooked, has gone out."""
    run_id = f"hung-{runtime}"
    if runtime == "pydantic_ai":
        from pydantic_ai.models.instrumented import InstrumentationSettings

        async def never(messages, info) -> ModelResponse:
            await asyncio.Event().wait()

        Agent.instrument_all(InstrumentationSettings(tracer_provider=tracer_provider))
        a = Agent(FunctionModel(never), name=_name("pa-hung-first", hooked))
        return a.name, asyncio.run(_hung(a.run(f"task {SECRET}"), hooked, run_id, finished))
    if runtime == "openai_agents":
        from agents import Agent as OAAgent, Runner, set_trace_processors
        from opentelemetry.instrumentation.openai_agents import OpenAIAgentsInstrumentor

        from tests.otel.openai_agents_runs import FakeModel, lookup

        set_trace_processors([])
        instrumentor = OpenAIAgentsInstrumentor()
        instrumentor.instrument(tracer_provider=tracer_provider)
        try:
            a = OAAgent(name=_name("oa-hung-first", hooked), model=FakeModel("lookup", hang_at=1), tools=[lookup])
            return a.name, asyncio.run(_hung(Runner.run(a, f"task {SECRET}"), hooked, run_id, finished))
        finally:
            instrumentor.uninstrument()
    if runtime == "langgraph":
        from openinference.instrumentation.langchain import LangChainInstrumentor

        from tests.otel.langgraph_runs import FakeToolModel, _react, lookup

        class Never(FakeToolModel):
            """A chat model whose call never returns."""

            async def _agenerate(self, *a, **k):
                await asyncio.Event().wait()

            async def _astream(self, *a, **k):
                await asyncio.Event().wait()
                yield

        instrumentor = LangChainInstrumentor()
        instrumentor.instrument(tracer_provider=tracer_provider)
        try:
            name = _name("lg-hung-first", hooked)
            a = _react(Never(messages=iter([])), [lookup], name=name)
            # the graph's span shows nothing as it starts: the scope names the run (its id and agent)
            msgs = {"messages": [("user", f"task {SECRET}")]}
            return name, asyncio.run(_hung(a.ainvoke(msgs), hooked, run_id, finished, agent=name))
        finally:
            instrumentor.uninstrument()
    assert runtime == "adk", runtime
    from google.adk.agents import LlmAgent

    from tests.otel.adk_runs import _fake_llm, _run, _use, lookup

    _use(tracer_provider)
    name = _name("adk_hung_first", hooked)
    a = LlmAgent(name=name, model=_fake_llm("lookup", hang=True), tools=[lookup])
    return name, asyncio.run(_hung(_run(a), hooked, run_id, finished))


def langgraph_named_run(tracer_provider) -> str:
    """A LangGraph run that finishes, in a scope naming its run id (``lg-named-run``) and agent: the agent."""
    from openinference.instrumentation.langchain import LangChainInstrumentor

    from tests.otel.langgraph_runs import _agent, _answer, _calls, lookup

    async def go(a) -> None:
        with hook.run("lg-named-run", agent=a.name):
            await a.ainvoke({"messages": [("user", f"task {SECRET}")]})

    instrumentor = LangChainInstrumentor()
    instrumentor.instrument(tracer_provider=tracer_provider)
    try:
        a = _agent("lg-named-hook", [_calls("lookup"), _answer()], [lookup])
        asyncio.run(go(a))
        return a.name
    finally:
        instrumentor.uninstrument()
