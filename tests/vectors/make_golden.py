"""Write tests/vectors/python-golden.jsonl: Python-encoded events covering every type and field.

Run ``python -m tests.vectors.make_golden`` after changing the wire types; a unit test
fails while the committed file differs from what this prints.
"""

from __future__ import annotations

import sys
from pathlib import Path

from loopwarden.codecs import (
    Approval,
    ApprovalResolved,
    ApprovalRouted,
    Custom,
    Evidence,
    EventsDropped,
    HealthTransition,
    LoopFinished,
    OutcomeReceipt,
    Policy,
    RunActive,
    RunEnded,
    RunStarted,
    SegmentStarted,
    StepCount,
    StepFinished,
    TokenBudget,
    ToolCall,
    ToolCallCondition,
    Usage,
    encode,
)

PATH = Path(__file__).with_name("python-golden.jsonl")
TS = 1_780_000_000_000
ROUTED = Approval(approval_id="ap-1", tool_call_id="tc-1", tool_name="pay_invoice", owner="finance-oncall",
                  deadline_ts=TS + 3_600_000, resume_token="tok-1")
UNROUTED = Approval(approval_id="ap-2", tool_call_id="tc-2", tool_name="pay_invoice")


def vectors() -> list:
    every_condition = (StepCount(count=20), ToolCallCondition(tools=("done", "finish")), LoopFinished(),
                       TokenBudget(max_tokens=50_000), Custom(name="stopOnToolError", role="bound"),
                       Custom(name="validated", role="completion"))
    out: list = [
        RunStarted(run_id="g-1", ts=TS, agent="invoice-agent", policy=Policy(version="v1")),
        RunStarted(run_id="g-2", ts=TS, agent="invoice-agent",
                   policy=Policy(version="v2", stop_when=every_condition, inactivity_timeout_s=30.5,
                                 receipt_window_s=120.0, required_outcomes=("file", "record"))),
        RunStarted(run_id="g-3", ts=TS, agent="a", policy=Policy(version="", stop_when=())),
        StepFinished(run_id="g-1", ts=TS + 1, step=0, finish_reason="stop"),
        StepFinished(run_id="g-2", ts=TS + 2, step=3, segment=1, finish_reason="tool-calls",
                     tool_calls=tuple(ToolCall(id=f"tc-{s}", name="lookup", status=s)
                                      for s in ("result", "error", "pending", "approval_requested", "denied",
                                                "cancelled")) + (
                         ToolCall(id="tc-p", name="web_search", status="result", provider_executed=True),),
                     usage=Usage(input_tokens=100, output_tokens=20, total_tokens=120)),
        StepFinished(run_id="g-2", ts=TS + 3, step=4, segment=1, finish_reason="length", usage=Usage(input_tokens=7)),
    ]
    for i, reason in enumerate(("content-filter", "error", "interrupted", "other")):
        out.append(StepFinished(run_id="g-3", ts=TS + 10 + i, step=i, finish_reason=reason))
    causes = ("natural_finish", "stop_condition", "unexecuted_tool", "tool_error", "aborted", "timeout", "error", "unknown")
    for i, cause in enumerate(causes):
        out.append(RunEnded(run_id=f"g-c{i}", ts=TS + 20 + i, cause=cause, step_count=i, approval=None,
                            error_name={"aborted": "AbortError", "timeout": "TimeoutError"}.get(cause),
                            fired=("step_count:20", "custom:stopOnToolError") if cause == "stop_condition" else ()))
    out += [
        RunEnded(run_id="g-a1", ts=TS + 30, segment=2, cause="approval_required", step_count=2, approval=ROUTED, error_name=None),
        RunEnded(run_id="g-a2", ts=TS + 31, cause="approval_required", step_count=1, approval=UNROUTED, error_name=None),
        RunEnded(run_id="g-s1", ts=TS + 31, cause="stop_condition", step_count=1, approval=None, error_name=None,
                 fired=("step_count:1",), steered=True),
        ApprovalRouted(run_id="g-a2", ts=TS + 32, approval_id="ap-2", owner="ops", deadline_ts=TS + 99, resume_token="tok-2"),
        ApprovalRouted(run_id="g-a2", ts=TS + 33, approval_id="ap-2", owner=None, deadline_ts=None, resume_token=None),
        ApprovalResolved(run_id="g-a1", ts=TS + 34, approval_id="ap-1", approved=True),
        ApprovalResolved(run_id="g-a2", ts=TS + 35, approval_id="ap-2", approved=False),
        # docs/contract.md section 11
        SegmentStarted(run_id="g-a1", ts=TS + 36, segment=3,
                       policy=Policy(version="v1-resume", stop_when=(StepCount(count=1),))),
        SegmentStarted(run_id="g-a2", ts=TS + 36, segment=1, policy=None),
        RunActive(run_id="g-a1", ts=TS + 37, segment=3, in_="tool", tool_call_id="tc-9"),
        RunActive(run_id="g-a1", ts=TS + 38, segment=3, in_="model", tool_call_id=None),
        EventsDropped(run_id="g-a1", ts=TS + 39, count=17),
    ]
    for i, (kind, verifier, verified) in enumerate((("file", "destination", True), ("record", "validator", False),
                                                     ("message", "human", True), ("deployment", "destination", True),
                                                     ("analysis", "validator", True), ("other", "human", False))):
        out.append(OutcomeReceipt(run_id="g-r", ts=TS + 40 + i, receipt_id=f"rc-{i}", kind=kind, verifier=verifier,
                                  verified=verified,
                                  evidence={"sha256": "ab" * 32, "size": 1024, "ratio": 0.5, "ok": True} if i == 0 else {}))
    out.append(HealthTransition(
        run_id="g-a1", seq=2, ts=TS + 30, emitted_ts=TS + 31, agent="invoice-agent", policy_version="v1",
        from_state="RUNNING", to_state="WAITING", reason="approval_required",
        evidence=Evidence(reported_cause="approval_required", derived_cause="approval_required", fired=(),
                          step_count=2, segments=3, tool_errors=1, finish_reason="tool-calls", disagreements=(),
                          receipt_ids=("rc-0",), approval=ROUTED, ignored={"duplicate_step": 1},
                          events_dropped=17)))
    out.append(HealthTransition(
        run_id="g-1", seq=1, ts=TS, emitted_ts=TS, agent=None, policy_version=None, from_state=None,
        to_state="RUNNING", reason="started",
        evidence=Evidence(reported_cause=None, derived_cause=None, fired=(), step_count=0, segments=0, tool_errors=0,
                          finish_reason=None, disagreements=(), receipt_ids=(), approval=None)))
    return out


def render() -> bytes:
    return b"".join(encode(v) + b"\n" for v in vectors())


if __name__ == "__main__":
    if "--check" in sys.argv:
        sys.exit(0 if PATH.read_bytes() == render() else 1)
    PATH.write_bytes(render())
    print(f"wrote {PATH} ({len(vectors())} events)")
