"""The producer hook (loopwarden.stages.otel.hook) on the real OpenTelemetry SDK, exporting to memory."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from loopwarden.stages.otel import hook
from tests.conftest import REPO

SECRET = "s3cr3t-PLANTED-0xC0FFEE"
MARKER = "loopwarden.run_start"
POLICY = {"version": "app@1", "stop_when": [{"kind": "custom", "name": "budget", "role": "bound"}]}


class Spans:
    """A tracer provider exporting through the hook to memory; GenAI-conventions spans of one agent."""

    def __init__(self, scope: str = "pydantic-ai") -> None:
        self.exporter = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(hook.RunSpans(SimpleSpanProcessor(self.exporter)))
        self.tracer = provider.get_tracer(scope)

    def agent(self, name: str = "agent"):
        return self.tracer.start_as_current_span(f"invoke_agent {name}", attributes={
            "gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": name, "gen_ai.input.messages": SECRET})

    def chat(self):
        return self.tracer.start_as_current_span("chat model", attributes={
            "gen_ai.operation.name": "chat", "gen_ai.output.messages": SECRET})

    def tool(self, call_id: str = "call-1"):
        return self.tracer.start_as_current_span("execute_tool delete", attributes={
            "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "delete", "gen_ai.tool.call.id": call_id,
            "gen_ai.tool.call.arguments": SECRET})

    def exported(self) -> dict[str, dict]:
        """The runtime's spans exported so far (the hook's start markers apart: :meth:`markers`)."""
        return {s.name: dict(s.attributes) for s in self.exporter.get_finished_spans() if s.name != MARKER}

    def markers(self) -> list:
        return [s for s in self.exporter.get_finished_spans() if s.name == MARKER]

    def marks(self) -> dict[str, dict]:
        return {name: {k: v for k, v in attrs.items() if k.startswith("loopwarden.")}
                for name, attrs in self.exported().items()}

    def exception_types(self) -> dict[str, list]:
        return {s.name: [dict(e.attributes) for e in s.events if e.name == "exception"]
                for s in self.exporter.get_finished_spans()}


def test_run_level_attributes_are_on_the_outer_runs_spans_never_on_a_sub_agents():
    """Run id, policy, job, attempt and recovers are on the run span and its calls, never on a sub-agent's."""
    s = Spans()
    with hook.run("run-7", policy=POLICY, job_id="job-1", attempt=2, recovers="run-6"):
        with s.agent("outer"):
            with s.chat():
                pass
            with s.agent("sub"), s.tool():
                pass
    marks = s.marks()
    outer, chat = marks.pop("invoke_agent outer"), marks.pop("chat model")
    assert outer == chat
    assert outer["loopwarden.run.id"] == "run-7"
    assert (outer["loopwarden.job.id"], outer["loopwarden.attempt"], outer["loopwarden.recovers"]) == ("job-1", 2, "run-6")
    assert json.loads(outer["loopwarden.policy"])["stop_when"] == [{"kind": "custom", "name": "budget", "role": "bound"}]
    assert marks == {"invoke_agent sub": {}, "execute_tool delete": {}}


def test_a_run_span_starting_exports_a_content_free_start_marker_at_once():
    """As a run span starts, a child of it ended at once goes out: the run's attributes and agent, no content."""
    s = Spans()
    with hook.run("run-7", policy=POLICY, job_id="job-1"):
        with s.agent("outer") as outer:
            (marker,) = s.markers()  # before any span of the run ended
            assert list(s.exported()) == []
            with s.agent("sub") as sub:
                pass
    first, second = s.markers()
    assert (first.parent.span_id, second.parent.span_id) == (outer.get_span_context().span_id,
                                                             sub.get_span_context().span_id)
    assert first.context.trace_id == outer.get_span_context().trace_id and first.end_time == first.start_time
    assert {k: v for k, v in first.attributes.items() if k != "loopwarden.policy"} == {
        "loopwarden.marker": "run_start", "loopwarden.agent": "outer", "loopwarden.run.id": "run-7",
        "loopwarden.job.id": "job-1"}
    # a sub-agent's marker names it and carries none of the run's attributes
    assert dict(second.attributes) == {"loopwarden.marker": "run_start", "loopwarden.agent": "sub"}
    assert first.instrumentation_scope.name == "pydantic-ai" and not first.events
    assert all(SECRET not in str(v) for m in s.markers() for v in m.attributes.values())


def test_the_agent_given_to_the_scope_names_its_run_on_its_start_marker():
    """run(agent=...) is the producer's name for the run: on its start marker, over the runtime's name."""
    s = Spans()
    with hook.run(agent="invoice-agent"):
        with s.agent("x"), s.chat():
            pass
    assert s.markers()[0].attributes["loopwarden.agent"] == "invoice-agent"
    # on the marker only: the spans of a sub-agent the hook cannot tell at their start would take it too
    assert {name: m.get("loopwarden.agent") for name, m in s.marks().items()} == {
        "chat model": None, "invoke_agent x": None}


def test_a_scope_with_a_run_id_sends_one_marker_on_its_first_span_when_that_span_starts_telling_nothing():
    """OpenInference tells a span only as it ends: the scope's first span gets the one marker, with the run's marks."""
    s = Spans("openinference.instrumentation.langchain")
    with hook.run("run-7", agent="graph-agent", policy=POLICY):
        with s.tracer.start_as_current_span("LangGraph") as graph:
            with s.tracer.start_as_current_span("agent"), s.tracer.start_as_current_span("ChatModel"):
                (marker,) = s.markers()  # as the graph's span started, before anything ended
    assert [m.context.span_id for m in s.markers()] == [marker.context.span_id]
    assert marker.parent.span_id == graph.get_span_context().span_id
    assert marker.instrumentation_scope.name == "openinference.instrumentation.langchain"
    assert {k: v for k, v in marker.attributes.items() if k != "loopwarden.policy"} == {
        "loopwarden.marker": "run_start", "loopwarden.run.id": "run-7", "loopwarden.agent": "graph-agent"}
    assert json.loads(marker.attributes["loopwarden.policy"])["version"] == "app@1"
    s = Spans("openinference.instrumentation.langchain")
    with hook.run("run-8"), s.tracer.start_as_current_span("LangGraph"):
        pass
    assert s.markers()[0].attributes["loopwarden.agent"] == "LangGraph"  # the bridge's name for the run span


def test_no_first_span_marker_without_a_run_id_or_on_a_first_span_that_says_what_it_is():
    """Without a run id LangGraph's thread names the run; a first span telling its role leaves the run span's marker."""
    s = Spans("openinference.instrumentation.langchain")
    with hook.run(agent="graph-agent"), s.tracer.start_as_current_span("LangGraph"):
        pass
    assert s.markers() == []
    s = Spans("opentelemetry.instrumentation.openai_agents")
    with hook.run("run-7"):
        with s.tracer.start_as_current_span("Agent workflow", attributes={"gen_ai.operation.name": "invoke_agent"}):
            with s.agent("outer") as outer:
                pass
    (marker,) = s.markers()
    assert marker.parent.span_id == outer.get_span_context().span_id
    assert marker.attributes["loopwarden.run.id"] == "run-7"


def test_no_start_marker_outside_a_run_scope():
    """Without a scope the hook sends nothing of its own."""
    s = Spans()
    with s.agent(), s.chat():
        pass
    assert s.markers() == []


def test_after_a_handoff_the_stop_marks_the_agent_handed_to_and_the_run_id_stays_with_the_first():
    """Two agents in turn under one workflow span: the stop is the last one's; the run id the first one's alone."""
    s = Spans()
    with hook.run("run-h") as run:
        with s.tracer.start_as_current_span("workflow"):
            with s.agent("triage"), s.chat():
                pass
            with s.agent("billing"), s.chat():
                pass
        run.mark_approval("call-2", "refund")
    marks = s.marks()
    assert marks["invoke_agent triage"] == {"loopwarden.run.id": "run-h"}
    assert marks["invoke_agent billing"]["loopwarden.stop.cause"] == "approval_required"
    assert "loopwarden.run.id" not in marks["invoke_agent billing"]


def test_calls_are_exported_as_they_end_and_the_run_span_when_the_scope_exits():
    """Inside a scope only the run span waits (for marks made after the runtime returned): a hung run's calls still reach the bridge."""
    s = Spans()
    with hook.run("run-1"):
        with s.agent():
            with s.chat():
                pass
            assert list(s.exported()) == ["chat model"]
        assert list(s.exported()) == ["chat model"]
    assert list(s.exported()) == ["chat model", "invoke_agent agent"]


def test_spans_outside_a_run_scope_pass_through_unchanged():
    """Without a scope the hook is inert: every span is exported at its end, with no loopwarden attribute."""
    s = Spans()
    with s.agent():
        with s.chat():
            pass
        assert list(s.exported()) == ["chat model"]
    assert s.marks() == {"chat model": {}, "invoke_agent agent": {}}


def test_an_approval_marked_after_the_runtime_returned_is_on_the_run_span():
    """mark_approval after the run's spans ended (OpenAI result.interruptions, a deferred output) marks the run span."""
    s = Spans()
    with hook.run() as run:
        with s.agent(), s.chat():
            pass
        run.mark_approval("call-9", "delete", owner="ops", deadline_ts=1_790_000_000_000, resume_token="tok-1")
    assert s.marks()["invoke_agent agent"] == {
        "loopwarden.stop.cause": "approval_required", "loopwarden.approval.id": "call-9",
        "loopwarden.approval.tool_call_id": "call-9", "loopwarden.approval.tool_name": "delete",
        "loopwarden.approval.owner": "ops", "loopwarden.approval.deadline_ts": 1_790_000_000_000,
        "loopwarden.approval.resume_token": "tok-1"}


def test_an_approval_marked_inside_the_tool_span_marks_that_tool_span_too():
    """mark_approval called while its tool span is open and current (ADK require_confirmation) marks the tool span as well."""
    s = Spans()
    with hook.run():
        with s.agent():
            with s.tool("call-3"):
                hook.mark_approval("call-3", "delete", approval_id="ap-3")
    marks = s.marks()
    assert marks["execute_tool delete"] == {"loopwarden.approval.id": "ap-3", "loopwarden.approval.tool_call_id": "call-3",
                                            "loopwarden.approval.tool_name": "delete"}
    assert marks["invoke_agent agent"]["loopwarden.stop.cause"] == "approval_required"


def test_a_stop_condition_that_does_not_raise_is_recorded_with_what_fired():
    """stop_condition records the cause and the fired condition ids on the run span."""
    s = Spans()
    with hook.run(policy=POLICY):
        with s.agent(), s.chat():
            pass
        hook.stop_condition(["custom:budget"])
    marks = s.marks()["invoke_agent agent"]
    assert (marks["loopwarden.stop.cause"], marks["loopwarden.stop.fired"]) == ("stop_condition", ("custom:budget",))


def test_the_first_stop_recorded_wins():
    """A stop recorded after another (a cancel after an approval) changes nothing: the run stopped for the first."""
    s = Spans()
    with hook.run() as run:
        with s.agent():
            run.stop_condition(["custom:budget"])
            run.stop_now("aborted", "CancelledError")
            run.mark_approval("call-1", "delete")
    assert s.marks()["invoke_agent agent"] == {"loopwarden.stop.cause": "stop_condition",
                                               "loopwarden.stop.fired": ("custom:budget",)}


async def _agent_run(s: Spans, started: asyncio.Event, finished: list) -> None:
    with s.agent():
        with s.chat():
            pass
        finished.append("chat")
        with s.tool():
            started.set()
            await asyncio.sleep(5)


def test_cancel_run_marks_every_still_open_span_aborted_before_cancelling():
    """cancel_run gives the open run and tool spans the cause aborted and a CancelledError event; ended spans keep theirs."""
    s = Spans()

    async def main():
        started = asyncio.Event()
        task = hook.start_run(_agent_run(s, started, []))
        await started.wait()
        assert hook.cancel_run(task)
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    marks, events = s.marks(), s.exception_types()
    for name in ("invoke_agent agent", "execute_tool delete"):
        assert marks[name] == {"loopwarden.stop.cause": "aborted"}
        assert {"exception.type": "CancelledError"} in events[name]
    assert marks["chat model"] == {} and events["chat model"] == []


def test_run_with_timeout_marks_the_open_spans_timeout_and_raises_timeout_error():
    """Past its bound the run's open spans get the cause timeout and a TimeoutError event, then TimeoutError is raised."""
    s = Spans()

    async def main():
        with pytest.raises(TimeoutError):
            await hook.run_with_timeout(_agent_run(s, asyncio.Event(), []), 0.05, run_id="run-t")

    asyncio.run(main())
    marks, events = s.marks(), s.exception_types()
    assert marks["invoke_agent agent"] == {"loopwarden.stop.cause": "timeout", "loopwarden.run.id": "run-t"}
    assert events["invoke_agent agent"][0] == {"exception.type": "TimeoutError"}
    assert marks["execute_tool delete"] == {"loopwarden.stop.cause": "timeout", "loopwarden.run.id": "run-t"}


def test_run_with_timeout_returns_what_a_run_within_its_bound_returns():
    """A run that finishes in time returns its result and records no stop."""
    s = Spans()

    async def quick():
        with s.agent():
            return "ok"

    assert asyncio.run(hook.run_with_timeout(quick(), 5)) == "ok"
    assert s.marks() == {"invoke_agent agent": {}}


@pytest.mark.parametrize(("raised", "cause"), [("RunCancelled", "aborted"), ("RunTimedOut", "timeout"),
                                                ("TimeoutError", "timeout")])
def test_a_cancellation_or_timeout_leaving_the_scope_is_recorded_as_its_runtime_row_says(raised, cause):
    """An exception the run span's runtime row calls a cancellation or timeout, raised after every span ended OK, is the stop."""
    s = Spans(scope="pydantic-ai")
    exc = type(raised, (Exception,), {})
    with pytest.raises(exc), hook.run():
        with s.agent(), s.chat():
            pass
        raise exc(SECRET)
    assert s.marks()["invoke_agent agent"] == {"loopwarden.stop.cause": cause}
    assert s.exception_types()["invoke_agent agent"] == [{"exception.type": raised}]


def test_a_cancelled_error_leaving_the_scope_records_no_stop_as_a_timeout_around_it_raises_one_too():
    """A CancelledError out of the scope may be a timeout's (asyncio.wait_for around it): no cause, no event added."""
    s = Spans(scope="pydantic-ai")
    exc = type("CancelledError", (Exception,), {})
    with pytest.raises(exc), hook.run():
        with s.agent(), s.chat():
            pass
        raise exc(SECRET)
    assert s.marks()["invoke_agent agent"] == {}
    assert s.exception_types()["invoke_agent agent"] == []


def test_an_ordinary_exception_leaving_the_scope_records_no_stop():
    """An error the runtime itself records (or not) is not the hook's to name: no cause is added."""
    s = Spans()
    with pytest.raises(ValueError), hook.run():
        with s.agent(), s.chat():
            pass
        raise ValueError(SECRET)
    assert s.marks()["invoke_agent agent"] == {}


def test_the_hook_records_no_content():
    """Every value the hook adds is an id, name, number or cause the application gave: no prompt, argument or message."""
    s = Spans()

    async def main():
        with hook.run("run-1", policy=POLICY) as run:
            with s.agent(), s.chat():
                pass
            run.mark_approval("call-1", "delete")
        task = hook.start_run(_agent_run(s, asyncio.Event(), []))
        await asyncio.sleep(0.01)
        hook.cancel_run(task)
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    added = [v for m in s.marks().values() for v in m.values()]
    added += [e for evs in s.exception_types().values() for e in evs]
    assert added and SECRET not in repr(added)
    assert all(set(e) == {"exception.type"} for evs in s.exception_types().values() for e in evs)


@pytest.mark.parametrize(("call", "named"), [
    (lambda: hook.Run(policy={"version": "v", "stop_when": [{"kind": "nope"}]}), "nope"),
    (lambda: hook.Run(attempt=0), "attempt must be an int >= 1, got 0"),
    (lambda: hook.Run(run_id=""), "run_id must be a non-empty string, got ''"),
    (lambda: hook.Run().stop_condition("custom:budget"), "'custom:budget'"),
    (lambda: hook.Run().mark_approval("call-1", "delete", deadline_ts="tomorrow"), "'tomorrow'"),
])
def test_a_wrong_value_is_refused_with_an_error_naming_it(call, named):
    """Bad policies, attempts, ids, fired lists and deadlines raise ValueError naming the value."""
    with pytest.raises(ValueError, match=named.replace("(", r"\(")):
        call()


def test_the_helpers_outside_a_run_scope_say_where_to_call_them():
    """mark_approval, stop_condition and record_policy outside a scope raise, naming the scope to use; a foreign task too."""
    with pytest.raises(RuntimeError, match="hook.run"):
        hook.mark_approval("call-1", "delete")

    async def main():
        task = asyncio.ensure_future(asyncio.sleep(1))
        try:
            with pytest.raises(ValueError, match="not started by loopwarden.stages.otel.hook.start_run"):
                hook.cancel_run(task)
        finally:
            task.cancel()

    asyncio.run(main())


def test_without_the_opentelemetry_sdk_the_import_error_names_what_to_install():
    """Importing the hook where the SDK is missing fails with one line naming the package to install."""
    code = ("import sys\n"
            "class NoSdk:\n"
            "    def find_spec(self, name, path=None, target=None):\n"
            "        if name.startswith('opentelemetry'): raise ImportError(name)\n"
            "sys.meta_path.insert(0, NoSdk())\n"
            "import loopwarden.stages.otel.hook\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1] == (
        "ImportError: loopwarden.stages.otel.hook needs the OpenTelemetry SDK: pip install opentelemetry-sdk")
