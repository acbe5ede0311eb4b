"""LangGraph agents on a fake chat model (no model calls), traced by OpenInference's LangChain
instrumentation, one per health state LangGraph can express."""

from __future__ import annotations

import itertools
import threading
import time
import warnings

from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, create_react_agent, tools_condition
from langgraph.types import Command, interrupt
from langgraph.warnings import LangGraphDeprecatedSinceV10

from tests.otel.pydantic_ai_runs import SECRET, Expected

_ids = itertools.count()


class FakeToolModel(GenericFakeChatModel):
    """GenericFakeChatModel that accepts tools (the scripted messages carry the tool calls)."""

    def bind_tools(self, tools, **kwargs):
        return self


def _calls(name: str) -> AIMessage:
    return AIMessage(content="", tool_calls=[{"name": name, "args": {"q": SECRET}, "id": f"call_{next(_ids)}"}],
                     response_metadata={"finish_reason": "tool_calls"})


def _answer() -> AIMessage:
    return AIMessage(content=f"done {SECRET}", response_metadata={"finish_reason": "stop"})


@tool
def lookup(q: str) -> str:
    """Look something up."""
    return f"found {SECRET}"


@tool
def boom(q: str) -> str:
    """Fail."""
    raise RuntimeError(f"tool failed {SECRET}")


@tool
def slow(q: str) -> str:
    """Take longer than the graph's step timeout."""
    time.sleep(1.0)
    return f"late {SECRET}"


@tool
def delete(q: str) -> str:
    """Delete something, after a human approves."""
    answer = interrupt({"question": f"delete {SECRET}?"})
    return f"deleted {answer}"


def _react(model, tools, **kw):
    # create_react_agent moved to the `langchain` package (not installed here); LangGraph keeps it to 2.0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", LangGraphDeprecatedSinceV10)
        return create_react_agent(model, tools, **kw)


def _agent(name: str, messages, tools, **kw):
    return _react(FakeToolModel(messages=iter(messages)), tools, name=name, **kw)


def _loop_graph(name: str, messages, tools):
    """The classic hand-built agent graph: a model node and a ToolNode, looping while tools are called."""
    model = FakeToolModel(messages=iter(messages))

    def call_model(state: MessagesState):
        return {"messages": [model.invoke(state["messages"])]}

    graph = StateGraph(MessagesState)
    graph.add_node("model", call_model)
    graph.add_node("tools", ToolNode(tools))
    graph.add_edge(START, "model")
    graph.add_conditional_edges("model", tools_condition)
    graph.add_edge("tools", "model")
    return graph.compile(name=name)


def _subgraph_graph(name: str, sub):
    """A parent graph whose node invokes a compiled sub-graph, then asks its own model."""
    model = FakeToolModel(messages=iter([_answer()]))

    def delegate(state: MessagesState):
        out = sub.invoke({"messages": [("user", f"part of the task {SECRET}")]})
        return {"messages": [out["messages"][-1]]}

    def call_model(state: MessagesState):
        return {"messages": [model.invoke(state["messages"])]}

    graph = StateGraph(MessagesState)
    graph.add_node("delegate", delegate)
    graph.add_node("model", call_model)
    graph.add_edge(START, "delegate")
    graph.add_edge("delegate", "model")
    return graph.compile(name=name, checkpointer=InMemorySaver())


def _invoke(agent, config=None) -> str | None:
    try:
        agent.invoke({"messages": [("user", f"task {SECRET}")]}, config=config)
    except Exception as exc:  # noqa: BLE001 - what the framework raised is the fact
        return type(exc).__name__
    return None


def run(tracer_provider) -> list[Expected]:
    from openinference.instrumentation.langchain import LangChainInstrumentor

    instrumentor = LangChainInstrumentor()
    instrumentor.instrument(tracer_provider=tracer_provider)
    try:
        done = []
        a = _agent("lg-natural", [_calls("lookup"), _answer()], [lookup])
        done.append(Expected("lg-natural", "VERIFYING", "natural_finish", _invoke(a)))
        a = _agent("lg-tool-error", [_calls("boom"), _answer()], [boom])
        done.append(Expected("lg-tool-error", "FAILED", "tool_error", _invoke(a)))
        # interrupt() in a tool: OpenInference keeps the span OK but records the GraphInterrupt exception
        a = _agent("lg-approval", [_calls("delete"), _answer()], [delete], checkpointer=InMemorySaver())
        done.append(Expected("lg-approval", "WAITING_UNROUTED", "approval_required",
                             _invoke(a, {"configurable": {"thread_id": "t1"}})))
        # a graph of its own (model node, ToolNode) at recursion_limit 4: model, tools, model, tools, then
        # GraphRecursionError: the bound after a step's tools ran
        g = _loop_graph("lg-bounded", [_calls("lookup") for _ in range(20)], [lookup])
        done.append(Expected("lg-bounded", "BOUNDED_STOP", "stop_condition", _invoke(g, {"recursion_limit": 4})))
        # create_react_agent at an odd limit raises right after a model call asked for a tool: the last step
        # gets one call `cancelled` for the tools that never ran, so the steps bear the bound out
        for limit in (5, 7):
            a = _agent(f"lg-react-bounded-{limit}", [_calls("lookup") for _ in range(20)], [lookup])
            done.append(Expected(f"lg-react-bounded-{limit}", "BOUNDED_STOP", "stop_condition",
                                 _invoke(a, {"recursion_limit": limit})))
        # ... and at an even limit it stops by itself ("need more steps"), recording nothing
        a = _agent("lg-react-bounded-quiet", [_calls("lookup") for _ in range(20)], [lookup])
        done.append(Expected("lg-react-bounded-quiet", "UNCERTAIN", "cause_mismatch",
                             _invoke(a, {"recursion_limit": 4}), truth="stop_condition"))

        class Failing(FakeToolModel):
            def _generate(self, *a, **k):
                raise ValueError(f"provider exploded {SECRET}")

        a = _react(Failing(messages=iter([])), [lookup], name="lg-exception")
        done.append(Expected("lg-exception", "FAILED", "error", _invoke(a)))
        # an interrupt resumed on the same thread: one run (the thread's), the resume its next segment
        a = _agent("lg-resumed", [_calls("delete"), _answer()], [delete], checkpointer=InMemorySaver())
        config = {"configurable": {"thread_id": "t-resumed"}}
        _invoke(a, config)
        try:
            a.invoke(Command(resume="yes"), config=config)
            raised = None
        except Exception as exc:  # noqa: BLE001
            raised = type(exc).__name__
        done.append(Expected("lg-resumed", "VERIFYING", "natural_finish", raised))
        # step_timeout: the graph's own TimeoutError on its run span
        a = _agent("lg-step-timeout", [_calls("slow"), _answer()], [slow])
        a.step_timeout = 0.3
        done.append(Expected("lg-step-timeout", "STUCK", "timeout", _invoke(a)))
        done += _subgraph_runs()
        return done
    finally:
        instrumentor.uninstrument()


def _subgraph_runs() -> list[Expected]:
    # a sub-graph invoked inside a node is a run of its own (its model calls and tool its steps), as a
    # sub-agent is; the parent's steps are its own model call only. The parent runs on a thread, which its
    # sub-graph's spans inherit: the thread's run is the parent.
    sub = _agent("lg-subgraph-inner", [_calls("lookup"), _answer()], [lookup])
    raised = _invoke(_subgraph_graph("lg-subgraph", sub), {"configurable": {"thread_id": "t-subgraph"}})
    return [Expected("lg-subgraph-inner", "VERIFYING", "natural_finish", raised),
            Expected("lg-subgraph", "VERIFYING", "natural_finish", raised)]


def subgraph(tracer_provider) -> list[Expected]:
    """Only the sub-graph scenario: a parent graph whose node invokes a sub-graph (two runs)."""
    from openinference.instrumentation.langchain import LangChainInstrumentor

    instrumentor = LangChainInstrumentor()
    instrumentor.instrument(tracer_provider=tracer_provider)
    try:
        return _subgraph_runs()
    finally:
        instrumentor.uninstrument()


def hung(tracer_provider, finished) -> tuple[Expected, list]:
    """A graph hung in its tool node (its graph span never ends), and the spans that ended while it hangs."""
    from openinference.instrumentation.langchain import LangChainInstrumentor

    instrumentor = LangChainInstrumentor()
    instrumentor.instrument(tracer_provider=tracer_provider)
    try:
        release = threading.Event()

        @tool
        def hang(q: str) -> str:
            """Hang until released."""
            release.wait()
            return f"late {SECRET}"

        a = _agent("lg-hung", [_calls("hang"), _answer()], [hang])
        thread = threading.Thread(target=_invoke, args=(a,), daemon=True)
        thread.start()
        time.sleep(1.0)
        spans = list(finished())  # what ended while it hangs
        release.set()  # then let it finish, so the process can exit (its later spans are not read)
        thread.join(10)
    finally:
        instrumentor.uninstrument()
    # it starts at its model node's spans (the first to end) and goes STUCK after the inactivity timeout;
    # only the graph's span names it, so it starts under the runtime's name
    return Expected("langgraph-openinference", "STUCK", "no_progress", None, truth="hung"), spans
