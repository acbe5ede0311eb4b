"""One row per agent runtime: which spans are runs, steps, tool calls; what means a bound,
an approval, a cancellation, a timeout (spec.md section 9). Data, not code paths.

A row is chosen by the span's instrumentation scope name; a span from an unknown scope
gets the OpenInference row when it carries ``openinference.span.kind``, the AI SDK <= 6
row when its name starts with ``ai.``, the AI SDK 7 row when it is a ``step N`` wrapper
(``agent_step``), and the GenAI-conventions row otherwise.

What a row cannot tell is not guessed: a runtime with no bound exception in its row can
never report ``stop_condition``, and a run whose cause no rule of spec section 9
recognises is reported ``unknown`` (UNCERTAIN).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec

ROLE_OTHER = 0
ROLE_RUN = 1
ROLE_MODEL = 2  # a model call: one step
ROLE_WRAPPER = 3  # a runtime's own per-step span around the model call (AI SDK 7 `step N`): not a step
ROLE_TOOL = 4
# the producer hook's start marker: a span it ends at once, as its run span starts, so the run is published
# (and can go STUCK) before any of its spans ends. Told by ``loopwarden.marker``, whatever the row.
ROLE_MARK = 5

GENAI_MODEL_OPS = ("chat", "generate_content", "text_completion")
CANCELLED = ("CancelledError", "AbortError", "KeyboardInterrupt")
TIMEOUTS = ("TimeoutError", "ReadTimeout", "TimeoutException")
# Cancellations a timeout makes too: asyncio.wait_for, anyio's fail_after and Pydantic AI's own ``timeout=``
# cancel the run's task, and the spans record the same CancelledError as for a deliberate cancel (the
# TimeoutError is raised to the caller only, outside every span). A JS AbortError is a deliberate abort:
# a timeout's AbortSignal gives a TimeoutError.
CANCEL_OR_TIMEOUT = ("CancelledError",)


@dataclass(frozen=True)
class Runtime:
    name: str
    scopes: tuple[str, ...] = ()  # instrumentation scope names that select this row
    run_ops: tuple[str, ...] = ("invoke_agent",)  # gen_ai.operation.name of a run span
    run_names: tuple[str, ...] = ()  # span names of a run span (runtimes without a GenAI name)
    run_kinds: tuple[str, ...] = ()  # openinference.span.kind of a run span
    model_ops: tuple[str, ...] = GENAI_MODEL_OPS
    model_name_suffixes: tuple[str, ...] = ()
    model_kinds: tuple[str, ...] = ()
    wrapper_ops: tuple[str, ...] = ()
    tool_ops: tuple[str, ...] = ("execute_tool",)
    tool_names: tuple[str, ...] = ()
    tool_kinds: tuple[str, ...] = ()
    # (attribute, value) on a tool span that marks the call as deferred for approval
    approval_attrs: tuple[tuple[str, str], ...] = ()
    approval_exceptions: tuple[str, ...] = ()  # exception types that mean "interrupted for approval"
    # exception type (last dotted part) raised by a bound the runtime enforces -> custom condition name
    bounds: tuple[tuple[str, str], ...] = ()
    cancelled: tuple[str, ...] = CANCELLED
    timeouts: tuple[str, ...] = TIMEOUTS
    # the cancellations of ``cancelled`` the spans cannot tell from a timeout: the cause is then not known
    # (UNCERTAIN), unless the producer hook recorded it
    cancel_or_timeout: tuple[str, ...] = CANCEL_OR_TIMEOUT
    # (status description prefix, exception type): a runtime that records an exception it raised only in
    # the span's status description (read only to compare with these prefixes, never copied)
    status_exceptions: tuple[tuple[str, str], ...] = ()
    run_needs_agent_name: bool = False  # an invoke_agent span without gen_ai.agent.name is not a run
    # LangChain ``metadata`` that makes a CHAIN/AGENT span a run: (key, value) it must hold, and a key it
    # must not (LangGraph: the graph's own span has no ``langgraph_node``; every node's span has one)
    run_metadata: tuple[tuple[str, str], ...] = ()
    run_metadata_absent: str = ""
    # LangChain ``metadata`` key naming the graph node a span runs in: the node's own span (named as the node)
    # is a wrapper between the graph's run span and the node's model and tool calls
    node_metadata: str = ""
    # LangChain ``metadata`` key of the conversation thread: every run on one thread is one run (a resumed
    # interrupt, the conversation's next turn), each trace of it a segment, as with loopwarden.run.id
    thread_metadata: str = ""
    # LangChain ``metadata`` key of a span's checkpoint namespace, one ``|``-separated part per graph level:
    # a span with more than one part runs inside a sub-graph, whose thread is its parent graph's, not its run's
    nested_metadata: str = ""
    # tool names (or the tool-role operation of a span without one) that hand the conversation to another
    # agent: a run whose last step did that ends stop_condition custom:handoff (a completion)
    handoff_tools: tuple[str, ...] = ()
    agent_on_run_only: bool = False  # gen_ai.agent.name on other spans is not the agent's (a generic name)
    # Roles whose missing parent span is taken to be the run span (it ends last, so it is the one
    # missing while the run goes on): lets a run start, and go STUCK, before its run span arrives. A wrapper
    # listed here must be a direct child of its run (AI SDK 7's `step N`, an OpenAI Agents turn, a
    # LangGraph node).
    parent_is_run: tuple[int, ...] = (ROLE_MODEL,)
    # A wrapper's parent span is always a run, even one no attribute marks: LangGraph runs each node under
    # its graph's span, and a sub-graph invoked inside a node has a span whose metadata is its calling
    # node's (nothing of its own tells it from any chain the node calls), so its nodes' spans say it is a
    # graph: a run of its own, as a sub-agent is.
    wrapper_parent_is_run: bool = False

    def bound_name(self, exc_type: str) -> str | None:
        short = exc_type.rsplit(".", 1)[-1]
        for exc, name in self.bounds:
            if exc == short:
                return name
        return None


RUNTIMES: tuple[Runtime, ...] = (
    # 0: any runtime that follows the GenAI semantic conventions: no bound, no approval known. Its model and
    # tool calls are children of the agent span.
    Runtime(name="genai", parent_is_run=(ROLE_MODEL, ROLE_TOOL)),
    # AI SDK 7 + @ai-sdk/otel: `invoke_agent` > `step N` (agent_step) > `chat`, `execute_tool`.
    # A pending approval leaves no tool span and no marker: the cause is then `unknown`.
    Runtime(name="ai-sdk-7", scopes=("gen_ai", "@ai-sdk/otel"), wrapper_ops=("agent_step",),
            parent_is_run=(ROLE_WRAPPER,), cancelled=CANCELLED + ("AbortError",)),
    # AI SDK <= 6 (LegacyOpenTelemetry): ai.generateText > ai.generateText.doGenerate, ai.toolCall
    Runtime(name="ai-sdk-6", scopes=("ai",), run_ops=(), run_names=("ai.generateText", "ai.streamText"),
            model_ops=(), model_name_suffixes=(".doGenerate", ".doStream"), tool_ops=(),
            tool_names=("ai.toolCall",)),
    # Pydantic AI (instrumentation version >= 5): deferral marker on the tool span; usage limits raise
    Runtime(name="pydantic-ai", scopes=("pydantic-ai",),
            approval_attrs=(("pydantic_ai.tool.deferral.name", "ApprovalRequired"),),
            bounds=(("UsageLimitExceeded", "usage_limit"),), parent_is_run=(ROLE_MODEL, ROLE_TOOL),
            cancelled=CANCELLED + ("RunCancelled",), timeouts=TIMEOUTS + ("RunTimedOut",)),
    # OpenAI Agents SDK through opentelemetry-instrumentation-openai-agents-v2: max_turns raises
    # (its workflow root is also invoke_agent, without an agent name: not a run). MaxTurnsExceeded is only
    # in the agent span's status description. Each turn is a span of operation `unknown` under the agent
    # span, holding the turn's `chat` and tool spans (the SDK's task span above the agent is `unknown` too:
    # no model or tool call has it for a parent). Every span names the agent "OpenAI Agent": only the
    # agent span's name is the agent's. A handoff is an `agent_handoff` span in the handing-off turn.
    Runtime(name="openai-agents", scopes=("opentelemetry.instrumentation.openai_agents",),
            tool_ops=("execute_tool", "agent_handoff"), handoff_tools=("agent_handoff",), wrapper_ops=("unknown",),
            bounds=(("MaxTurnsExceeded", "max_turns"),), parent_is_run=(ROLE_WRAPPER,),
            status_exceptions=(("Max turns exceeded", "MaxTurnsExceeded"),), run_needs_agent_name=True,
            agent_on_run_only=True),
    # LangGraph through OpenInference: the graph is the AGENT (or top CHAIN) span; interrupt() raises
    # GraphInterrupt; recursion_limit raises GraphRecursionError.
    # OpenInference calls AGENT any run whose name holds "agent" (the react agent's model node too), so
    # the run is the graph's own CHAIN/AGENT span, told by LangGraph's metadata. OpenInference records
    # no GraphInterrupt (it is a control exception to it): an interrupt() for approval is not recorded.
    Runtime(name="langgraph-openinference", scopes=("openinference.instrumentation.langchain",),
            run_ops=(), run_kinds=("CHAIN", "AGENT"), model_ops=(), model_kinds=("LLM",), tool_ops=(),
            tool_kinds=("TOOL",), approval_exceptions=("GraphInterrupt", "NodeInterrupt"),
            bounds=(("GraphRecursionError", "recursion_limit"),), parent_is_run=(ROLE_WRAPPER,),
            run_metadata=(("ls_integration", "langgraph"),), run_metadata_absent="langgraph_node",
            node_metadata="langgraph_node", thread_metadata="thread_id", wrapper_parent_is_run=True,
            nested_metadata="langgraph_checkpoint_ns"),
    # (rows are appended: a span's row is kept by its index in the bridge's state)
    # Google ADK (tracer gcp.vertex.agent): invoke_workflow > invoke_agent > generate_content, execute_tool.
    # max_llm_calls raises LlmCallsLimitExceededError before the next model call; a transfer to another agent
    # is its transfer_to_agent tool, and the target runs as an invoke_agent span of its own.
    Runtime(name="adk", scopes=("gcp.vertex.agent",), handoff_tools=("transfer_to_agent",),
            bounds=(("LlmCallsLimitExceededError", "max_llm_calls"),), parent_is_run=(ROLE_MODEL, ROLE_TOOL)),
)
GENAI, AI_SDK_7, AI_SDK_6, OPENINFERENCE = 0, 1, 2, 5
BY_SCOPE = {scope: (i, row) for i, row in enumerate(RUNTIMES) for scope in row.scopes}


def select_runtime(scope_name: str, span_name: str, attrs: dict[str, Any]) -> tuple[int, Runtime]:
    """The row of a span: by its scope, else by what it carries."""
    found = BY_SCOPE.get(scope_name)
    if found is not None:
        return found
    if "openinference.span.kind" in attrs:
        return OPENINFERENCE, RUNTIMES[OPENINFERENCE]
    if span_name.startswith("ai.") or "ai.operationId" in attrs:
        return AI_SDK_6, RUNTIMES[AI_SDK_6]
    if attrs.get("gen_ai.operation.name") == "agent_step":  # AI SDK 7 under a tracer of another name
        return AI_SDK_7, RUNTIMES[AI_SDK_7]
    return GENAI, RUNTIMES[GENAI]


def classify(row: Runtime, span_name: str, attrs: dict[str, Any]) -> int:
    """The span's role under its runtime's row."""
    op = attrs.get("gen_ai.operation.name")
    kind = attrs.get("openinference.span.kind")
    op_id = attrs.get("ai.operationId") or span_name
    if op is not None:
        if op in row.run_ops:
            if row.run_needs_agent_name and not attrs.get("gen_ai.agent.name"):
                return ROLE_OTHER
            return ROLE_RUN
        if op in row.wrapper_ops:
            return ROLE_WRAPPER
        if op in row.model_ops:
            return ROLE_MODEL
        if op in row.tool_ops:
            return ROLE_TOOL
    if kind is not None:
        if kind in row.run_kinds:
            if not row.run_metadata:
                return ROLE_RUN
            role = _metadata_role(row, span_name, attrs.get("metadata"))
            if role != ROLE_OTHER:
                return role
        if kind in row.model_kinds:
            return ROLE_MODEL
        if kind in row.tool_kinds:
            return ROLE_TOOL
    if op_id in row.run_names:
        return ROLE_RUN
    if row.model_name_suffixes and op_id.endswith(row.model_name_suffixes):
        return ROLE_MODEL
    if op_id in row.tool_names:
        return ROLE_TOOL
    return ROLE_OTHER


_metadata = msgspec.json.Decoder(dict[str, Any])


def _metadata_role(row: Runtime, span_name: str, text: str | None) -> int:
    """A CHAIN/AGENT span's role from its LangChain metadata: the graph's own span is the run, a node's own
    span (named as its node) a wrapper, anything else inside a node nothing."""
    if not text:
        return ROLE_OTHER
    try:
        meta = _metadata.decode(text)
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
        return ROLE_OTHER
    if not all(meta.get(k) == v for k, v in row.run_metadata):
        return ROLE_OTHER
    if row.run_metadata_absent and row.run_metadata_absent in meta:
        return ROLE_WRAPPER if row.node_metadata and meta.get(row.node_metadata) == span_name else ROLE_OTHER
    return ROLE_RUN


THREAD_RUN_PREFIX = "langgraph-thread:"


def thread_run_id(row: Runtime, text: str | None) -> str:
    """The run id a span's thread gives (``langgraph-thread:<thread id>``), or "" when it has none."""
    if not text or not row.thread_metadata or f'"{row.thread_metadata}"' not in text:
        return ""
    try:
        meta = _metadata.decode(text)
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
        return ""
    namespace = meta.get(row.nested_metadata) if row.nested_metadata else None
    if isinstance(namespace, str) and "|" in namespace:
        return ""  # a sub-graph's span: the thread is its parent graph's run, not this one
    thread = meta.get(row.thread_metadata)
    if isinstance(thread, bool) or not isinstance(thread, (str, int)) or thread == "":
        return ""
    run_id = f"{THREAD_RUN_PREFIX}{thread}"
    return run_id if len(run_id) <= 200 else ""
