"""The producer hook's `loopwarden.*` span attributes, read by the bridge on any runtime: they win over inference,
and a bad value costs that attribute (counted, its run UNCERTAIN), never the span or the trace."""

from __future__ import annotations

import json

import msgspec
import pytest

from loopwarden.codecs import RunEnded, RunStarted, StepFinished
from loopwarden.codecs.events import Custom, Policy, StepCount, ToolCall
from loopwarden.stages.otel import Limits, decode_traces
from tests.otel.bridge import Bridge, replay
from tests.otel.traces import Run, span, traces
from tests.unit.test_otel_bridge import _json_traces as otlp_json

POLICY = json.dumps({"version": "app-7", "stop_when": [{"kind": "step_count", "count": 3}],
                     "inactivity_timeout_s": 60})


def run_of(b: Bridge) -> dict[str, tuple[str, str]]:
    return {run: (t.to_state, t.reason) for run, t in replay(b.events()).final.items()}


def of(b: Bridge, kind):
    return [e for e in b.events() if isinstance(e, kind)]


@pytest.mark.parametrize("scope", ["pydantic-ai", "gen_ai", "opentelemetry.instrumentation.openai_agents",
                                   "some-runtime"])
def test_producer_run_id_replaces_the_otel_run_id_on_every_runtime(scope):
    """loopwarden.run.id on the run's spans is the run id of every event, whatever the runtime's row."""
    b = Bridge()
    r = Run()
    hook = {"loopwarden__run__id": "order-42"}
    b.fold([traces(r.chat(**hook), r.tool(**hook), r.chat("stop", **hook), r.end(**hook), scope=scope)])
    assert {e.run_id for e in b.events()} == {"order-42"}


def test_a_later_trace_with_the_same_run_id_is_the_same_runs_next_segment():
    """An approval asked in one trace and resumed in another: one run, WAITING then VERIFYING, segments by start."""
    b = Bridge()
    first = Run(start_ms=0)
    ask = {"loopwarden__approval__id": "ap-1", "loopwarden__approval__owner": "ops",
           "loopwarden__approval__deadline_ts": 1_790_000_900_000, "loopwarden__approval__resume_token": "tok"}
    b.fold([traces(first.chat(loopwarden__run__id="order-42"), first.tool("delete", **ask),
                   first.end(loopwarden__run__id="order-42", loopwarden__stop__cause="approval_required"))])
    ended = of(b, RunEnded)[0]
    assert ended.cause == "approval_required" and ended.approval.approval_id == "ap-1" and ended.approval.routed
    assert run_of(b) == {"order-42": ("WAITING", "approval_required")}
    resumed = Run(start_ms=60_000)  # another trace, maybe on another partition: nothing shared but the id
    b.fold([traces(resumed.chat("stop", loopwarden__run__id="order-42"), resumed.end(loopwarden__run__id="order-42"))])
    segments = [e.segment for e in b.events() if isinstance(e, (StepFinished, RunEnded))]
    assert segments == sorted(segments) and len(set(segments)) == 2
    assert run_of(b) == {"order-42": ("VERIFYING", "natural_finish")}


def test_a_resumed_trace_that_ends_cleanly_does_not_overtake_the_interrupted_one():
    """Under a producer run id a clean run waits the end grace too, so the segments' run_ended go out in order."""
    b = Bridge()
    b.task = b.new_task(limits=Limits(end_grace_s=2))
    first, resumed = Run(start_ms=0), Run(start_ms=100)
    hook = {"loopwarden__run__id": "order-42"}
    b.fold([traces(first.chat(**hook), first.tool("delete", loopwarden__approval__id="ap-1", **hook),
                   first.end(loopwarden__stop__cause="approval_required", **hook))])
    b.fold([traces(resumed.chat("stop", **hook), resumed.end(**hook))])
    b.now_ms += 2_000
    b.fold([], punctuate=True)
    segments = [e.segment for e in of(b, RunEnded)]
    assert segments == sorted(segments) and len(segments) == 2
    assert run_of(b) == {"order-42": ("VERIFYING", "natural_finish")}


def test_two_runs_of_one_trace_with_one_run_id_keep_them_apart():
    """A sub-agent given its parent's run id keeps its own otel run id (counted), never merging two runs."""
    b = Bridge()
    outer, inner = Run("outer"), None
    inner = Run("inner", tid=outer.tid)
    hook = {"loopwarden__run__id": "order-42"}
    b.fold([traces(outer.chat("stop", **hook), outer.end(**hook))])
    b.fold([traces(inner.chat("stop", **hook), inner.end(**hook))])
    assert len({e.run_id for e in of(b, RunStarted)}) == 2
    assert b.counts["otel", "hook_run_id_reused"] == 1


@pytest.mark.parametrize("cause,fired,state", [
    ("aborted", [], ("BOUNDED_STOP", "aborted")),
    ("timeout", [], ("STUCK", "timeout")),
    ("error", [], ("FAILED", "error")),
])
def test_producer_stop_cause_wins_over_spans_that_ended_ok(cause, fired, state):
    """A cancel or timeout the spans did not record (every span OK) is the cause the hook recorded."""
    b = Bridge()
    r = Run()
    b.fold([traces(r.chat(), r.tool(), r.end(loopwarden__stop__cause=cause, loopwarden__stop__fired=fired))])
    assert of(b, RunEnded)[0].cause == cause
    assert list(run_of(b).values()) == [state]


def test_producer_policy_is_the_runs_policy_and_its_bound_is_evaluated():
    """loopwarden.policy is run_started's policy (the runtime's own bounds added); a fired step cap is BOUNDED_STOP."""
    b = Bridge()
    r = Run()
    hook = {"loopwarden__policy": POLICY}
    b.fold([traces(r.chat(**hook), r.tool(**hook), r.chat(**hook), r.tool(**hook), r.chat(**hook), r.tool(**hook),
                   r.end(loopwarden__stop__cause="stop_condition", loopwarden__stop__fired=["step_count:3"]))])
    policy = of(b, RunStarted)[0].policy
    assert policy.version == "app-7" and policy.inactivity_timeout_s == 60
    assert policy.stop_when == (StepCount(count=3), Custom(name="usage_limit", role="bound"))
    assert list(run_of(b).values()) == [("BOUNDED_STOP", "stop_condition")]


def test_approval_attributes_mark_a_tool_call_on_any_runtime():
    """loopwarden.approval.* on a tool span of a runtime with no marker of its own: approval_required, routed."""
    b = Bridge()
    r = Run()
    chat = r.chat()
    call = r.tool("delete", loopwarden__approval__id="ap-9", loopwarden__approval__owner="ops",
                  loopwarden__approval__deadline_ts=1_790_000_900_000, loopwarden__approval__resume_token="tok")
    b.fold([traces(chat, call, r.end(), scope="some-runtime")])
    ended = of(b, RunEnded)[0]
    assert (ended.cause, ended.approval.approval_id, ended.approval.owner, ended.approval.resume_token) == (
        "approval_required", "ap-9", "ops", "tok")
    assert of(b, StepFinished)[0].tool_calls[0].status == "approval_requested"
    assert list(run_of(b).values()) == [("WAITING", "approval_required")]


ROUTE = {"loopwarden__approval__owner": "ops", "loopwarden__approval__deadline_ts": 1_790_000_900_000,
         "loopwarden__approval__resume_token": "tok"}


def test_approval_marks_on_the_run_span_route_a_deferred_tool_span_that_has_none():
    """A tool span the runtime deferred, its approval's marks on the run span (set after it ended): WAITING, routed."""
    b = Bridge()
    r = Run()
    call = r.tool("delete", gen_ai__tool__call__id="call-7", pydantic_ai__tool__deferral__name="ApprovalRequired")
    b.fold([traces(r.chat(), call, r.end(loopwarden__stop__cause="approval_required", loopwarden__approval__id="ap-7",
                                         loopwarden__approval__tool_call_id="call-7",
                                         loopwarden__approval__tool_name="delete", **ROUTE))])
    approval = of(b, RunEnded)[0].approval
    assert (approval.approval_id, approval.tool_call_id, approval.owner, approval.routed) == (
        "ap-7", "call-7", "ops", True)
    assert list(run_of(b).values()) == [("WAITING", "approval_required")]


def test_a_run_span_approval_of_a_call_with_no_tool_span_adds_it_to_the_last_step():
    """An approval on the run span of a call with no tool span (Pydantic AI requires_approval): its last step has it."""
    b = Bridge()
    r = Run()
    b.fold([traces(r.chat(), r.end(loopwarden__stop__cause="approval_required", loopwarden__approval__id="call-9",
                                   loopwarden__approval__tool_call_id="call-9",
                                   loopwarden__approval__tool_name="delete", **ROUTE))])
    assert of(b, StepFinished)[-1].tool_calls == (ToolCall("call-9", "delete", "approval_requested"),)
    approval = of(b, RunEnded)[0].approval
    assert (approval.tool_call_id, approval.tool_name, approval.resume_token) == ("call-9", "delete", "tok")
    assert list(run_of(b).values()) == [("WAITING", "approval_required")]


@pytest.mark.parametrize("attr,value", [
    ("loopwarden__stop__cause", 42),
    ("loopwarden__stop__cause", "finished"),  # not a cause of the contract
    ("loopwarden__stop__fired", [1, 2]),
    ("loopwarden__policy", "{not json"),
    ("loopwarden__policy", json.dumps({"version": "v", "stop_when": [{"kind": "step_count", "count": -1}]})),
    ("loopwarden__run__id", 7),
    ("loopwarden__attempt", 0),
    ("loopwarden__job__id", ["a"]),
    ("loopwarden__approval__deadline_ts", "tomorrow"),
])
def test_a_bad_hook_value_costs_the_attribute_not_the_span(attr, value):
    """A hook attribute of the wrong type or content: counted, the run ends UNCERTAIN; no dead letter, no span lost."""
    b = Bridge()
    r = Run()
    b.fold([traces(r.chat(), r.tool(), r.chat("stop"), r.end(**{attr: value}))])
    assert b.deadletters == []
    assert b.counts["otel", "hook_attribute_bad"] == 1
    assert [e.step for e in of(b, StepFinished)] == [0, 1]
    assert of(b, RunEnded)[0].cause == "unknown"
    assert [state for state, _reason in run_of(b).values()] == ["UNCERTAIN"]


def test_hook_attributes_read_the_same_from_otlp_json():
    """The OTLP/JSON decoder reads and refuses the hook attributes as the protobuf one does."""
    r = Run()
    spans = [r.chat(loopwarden__run__id="order-1", loopwarden__policy=POLICY),
             r.end(loopwarden__stop__cause=3, loopwarden__stop__fired=["custom:x"])]
    proto = traces(*spans)
    assert decode_traces(otlp_json(proto)) == decode_traces(proto)
    chat, end = decode_traces(proto)
    assert chat.hook.run_id == "order-1" and chat.hook.policy == msgspec.json.decode(POLICY, type=Policy)
    assert (end.hook.cause, end.hook.fired, end.hook.bad) == ("", ("custom:x",), 1)


def test_spans_without_hook_attributes_carry_no_hook():
    """Spans of a run without the hook decode with no hook record on any of them."""
    r = Run()
    assert all(s.hook is None for s in decode_traces(traces(r.chat(), r.tool(), r.end())))


def _marker(r: Run, **kw):
    """The hook's start marker of run ``r``: a child of its run span, ended as it started, no content."""
    return span(r.tid, "loopwarden.run_start", r.start_ms, r.start_ms, parent=r.sid, **kw)


def test_the_start_marker_publishes_its_run_before_any_of_its_spans_ends():
    """The marker alone gives run_started, under its run id, agent and policy; the run's spans then join it."""
    b = Bridge()
    r = Run(agent="runtime-name")
    b.fold([traces(_marker(r, loopwarden__marker="run_start", loopwarden__agent="invoice-agent",
                           loopwarden__run__id="order-9", loopwarden__policy=POLICY))])
    (started,) = b.events()
    assert (started.run_id, started.agent, started.policy.version) == ("order-9", "invoice-agent", "app-7")
    b.fold([traces(r.chat(), r.tool(), r.chat("stop"), r.end())])
    assert len(of(b, RunStarted)) == 1 and {e.run_id for e in b.events()} == {"order-9"}
    assert [e.step for e in of(b, StepFinished)] == [0, 1]
    assert run_of(b) == {"order-9": ("VERIFYING", "natural_finish")}


def test_a_marker_of_another_value_is_a_refused_hook_attribute_and_starts_nothing():
    """loopwarden.marker other than run_start: counted hook_attribute_bad, no run from it."""
    b = Bridge()
    r = Run()
    b.fold([traces(_marker(r, loopwarden__marker="begin", loopwarden__agent="x"))])
    assert b.events() == [] and b.counts["otel", "hook_attribute_bad"] == 1
