"""One row per rule of docs/contract.md section 5, replayed through the core on an event-time clock."""

from __future__ import annotations

from typing import Any, NamedTuple

import msgspec
import pytest

from loopwarden.codecs import decode_input
from loopwarden.replay import Replay
from loopwarden.rules import Settings
from loopwarden.rules.machine import evidence_of
from tests.builders import (
    DONE_POLICY,
    active,
    approval,
    dropped,
    ended,
    receipt,
    resolved,
    routed,
    segment_started,
    started,
    step,
    steps,
    timed,
)

CAP3 = [{"kind": "step_count", "count": 3}]
WINDOW_S = 600


class Row(NamedTuple):
    rule: str
    events: list[dict]
    state: str
    reason: str
    advance_s: float = 0
    path: tuple[str, ...] | None = None  # every to_state, in order, when the rule is about the path
    evidence: dict[str, Any] | None = None  # fields of the run's evidence after the last event


def run(events: list[dict], advance_s: float = 0) -> tuple[list[dict], dict]:
    """Transitions as dicts, and the run's evidence after the last event (as the read API shows it)."""
    replay = Replay()
    out = []
    for e in events:
        out += replay.feed(decode_input(msgspec.json.encode(e)))
    out += replay.finish(advance_s)
    state = replay.states.get(events[-1]["run_id"])
    evidence = msgspec.json.decode(msgspec.json.encode(evidence_of(state))) if state is not None else {}
    return [msgspec.json.decode(msgspec.json.encode(t)) for t in out], evidence


natural = [started(), step(0, ("lookup", "result")), step(1), ended("natural_finish", 2)]

ROWS = [
    # -- completion needs a receipt ------------------------------------------------------
    Row("natural finish then a verified receipt", timed(*natural, receipt("rc1")),
        "VERIFIED_COMPLETE", "receipt", path=("RUNNING", "VERIFYING", "VERIFIED_COMPLETE")),
    Row("natural finish, no receipt: window expires", timed(*natural), "FALSE_COMPLETE",
        "receipt_window_expired", advance_s=WINDOW_S),
    Row("window not yet over: still verifying", timed(*natural), "VERIFYING", "natural_finish",
        advance_s=WINDOW_S - 5),
    Row("receipt_window_s from the policy", timed(started(stop_when=DONE_POLICY, receipt_window_s=10), *natural[1:]),
        "FALSE_COMPLETE", "receipt_window_expired", advance_s=11),
    Row("receipt held before run_ended decides at once", timed(*natural[:3], receipt("rc1"), natural[3]),
        "VERIFIED_COMPLETE", "receipt", path=("RUNNING", "VERIFIED_COMPLETE")),
    Row("receipt before any event of the run is held", timed(receipt("rc1", ts=1_900_000), *natural),
        "VERIFIED_COMPLETE", "receipt", path=("RUNNING", "VERIFIED_COMPLETE")),
    Row("negative receipt while verifying", timed(*natural, receipt("rc1", verified=False)),
        "FALSE_COMPLETE", "negative_receipt"),
    Row("held negative receipt decides at once", timed(receipt("rc1", verified=False, ts=1_900_000), *natural),
        "FALSE_COMPLETE", "receipt", path=("RUNNING", "FALSE_COMPLETE")),
    # -- a receipt answers one occurrence of the run id (section 10) ---------------------------
    Row("receipt stamped before the run started: stale, changes nothing",
        timed(*natural[:3], receipt("rc1", ts=900_000), natural[3]), "VERIFYING", "natural_finish",
        evidence={"ignored": {"stale_receipt": 1}, "untrusted_receipt_ids": ["rc1"], "receipt_ids": []}),
    Row("receipt naming an earlier run_started: stale, however late its own ts",
        timed(*natural, receipt("rc1", ts=1_500_000, run_started_ts=500_000)), "VERIFYING", "natural_finish",
        evidence={"ignored": {"stale_receipt": 1}, "untrusted_receipt_ids": ["rc1"]}),
    Row("receipt naming this run_started counts, though its verifier's clock is behind",
        timed(*natural, receipt("rc1", ts=999_000, run_started_ts=1_000_000)), "VERIFIED_COMPLETE", "receipt"),
    Row("held receipt stamped before the run's first event: refused when the run starts",
        timed(receipt("rc1", ts=900_000), *natural), "VERIFYING", "natural_finish",
        evidence={"ignored": {"stale_receipt": 1}, "untrusted_receipt_ids": ["rc1"], "receipt_ids": []}),
    Row("held receipts: the stale one is refused, the fresh one of the same kind still counts",
        timed(receipt("old", ts=900_000), receipt("new", ts=1_900_000, run_started_ts=1_002_000), *natural),
        "VERIFIED_COMPLETE", "receipt", evidence={"receipt_ids": ["new"], "untrusted_receipt_ids": ["old"]}),
    Row("late receipt after the window", timed(*natural) + [receipt("rc1", ts=1_000_000 + (WINDOW_S + 60) * 1000)],
        "VERIFIED_COMPLETE", "late_receipt", path=("RUNNING", "VERIFYING", "FALSE_COMPLETE", "VERIFIED_COMPLETE")),
    Row("receipt after a non-completion verdict: evidence only",
        timed(started(stop_when=CAP3), *steps(3), ended("stop_condition", 3, "step_count:3"), receipt("rc1")),
        "BOUNDED_STOP", "stop_condition"),
    Row("required outcomes: all kinds must be verified",
        timed(started(required_outcomes=["file", "record"]), *natural[1:], receipt("a", "file")),
        "VERIFYING", "natural_finish"),
    Row("required outcomes covered",
        timed(started(required_outcomes=["file", "record"]), *natural[1:], receipt("a", "file"), receipt("b", "record")),
        "VERIFIED_COMPLETE", "receipt"),
    Row("negative receipt for a kind not required is no verdict",
        timed(started(required_outcomes=["file"]), *natural[1:], receipt("a", "record", verified=False)),
        "VERIFYING", "natural_finish"),
    Row("negative receipt for a required kind",
        timed(started(required_outcomes=["file"]), *natural[1:], receipt("a", "file", verified=False)),
        "FALSE_COMPLETE", "negative_receipt"),
    Row("duplicate receipt ignored and counted", timed(*natural, receipt("rc1", verified=False), receipt("rc1", verified=False)),
        "FALSE_COMPLETE", "negative_receipt", evidence={"ignored": {"duplicate_receipt": 1}, "receipt_ids": ["rc1"]}),
    # -- derived causes ----------------------------------------------------------------
    Row("tool without execute: unexecuted_tool", timed(started(), step(0, ("done", "pending")), ended("unexecuted_tool", 1)),
        "VERIFYING", "unexecuted_tool", evidence={"derived_cause": "unexecuted_tool", "fired": []}),
    Row("hasToolCall(done) with execute: completion condition",
        timed(started(), step(0, ("done", "result")), ended("stop_condition", 1, "tool_call:done")),
        "VERIFYING", "stop_condition", evidence={"fired": ["tool_call:done"]}),
    Row("finish reason length ends the loop naturally, calls unexecuted",
        timed(started(), step(0, ("lookup", "pending"), finish="length"), ended("natural_finish", 1)),
        "VERIFYING", "natural_finish", evidence={"finish_reason": "length"}),
    Row("step cap is a bound", timed(started(stop_when=CAP3), *steps(3), ended("stop_condition", 3, "step_count:3")),
        "BOUNDED_STOP", "stop_condition"),
    # Experimental steering (ai >= 7.0.154): a steering message waiting after a text-only step makes
    # the SDK evaluate stopWhen there; a real isStepCount(1) agent then stops bounded.
    Row("steered: stopWhen evaluated after a text-only step, step cap fires",
        timed(started(stop_when=[{"kind": "step_count", "count": 1}]), step(0),
              ended("stop_condition", 1, "step_count:1", steered=True)),
        "BOUNDED_STOP", "stop_condition", evidence={"derived_cause": "stop_condition", "fired": ["step_count:1"]}),
    Row("the same run reported without `steered` (an emitter that does not know): uncertain",
        timed(started(stop_when=[{"kind": "step_count", "count": 1}]), step(0),
              ended("stop_condition", 1, "step_count:1")),
        "UNCERTAIN", "cause_mismatch", evidence={"derived_cause": "natural_finish"}),
    Row("steered, but the policy does not fire there: the SDK would have gone on",
        timed(started(stop_when=[{"kind": "step_count", "count": 5}]), step(0),
              ended("stop_condition", 1, "step_count:5", steered=True)),
        "UNCERTAIN", "cause_mismatch", evidence={"derived_cause": "unknown"}),
    Row("steered, the step finished with an error: no evaluation, a provider error (rule 2b)",
        timed(started(stop_when=[{"kind": "step_count", "count": 1}]), step(0, finish="error"),
              ended("error", 1, steered=True, error_name="AI_APICallError")),
        "FAILED", "error", evidence={"derived_cause": "error", "disagreements": []}),
    Row("token budget is a bound",
        timed(started(stop_when=[{"kind": "token_budget", "max_tokens": 100}]),
              step(0, ("a", "result"), tokens=60), step(1, ("a", "result"), tokens=60),
              ended("stop_condition", 2, "token_budget:100")),
        "BOUNDED_STOP", "stop_condition"),
    Row("token budget falls back to input + output",
        timed(started(stop_when=[{"kind": "token_budget", "max_tokens": 30}]),
              *steps(2), ended("stop_condition", 2, "token_budget:30")),
        "BOUNDED_STOP", "stop_condition"),
    Row("custom bound condition fired", timed(started(stop_when=[{"kind": "custom", "name": "budget", "role": "bound"}]),
                                              *steps(2), ended("stop_condition", 2, "custom:budget")),
        "BOUNDED_STOP", "stop_condition"),
    Row("custom completion condition fired", timed(started(stop_when=[{"kind": "custom", "name": "ok", "role": "completion"}]),
                                                   *steps(2), ended("stop_condition", 2, "custom:ok")),
        "VERIFYING", "stop_condition"),
    Row("a bound and a completion fired together: bounded",
        timed(started(stop_when=[{"kind": "step_count", "count": 1}, {"kind": "tool_call", "tools": ["done"]}]),
              step(0, ("done", "result")), ended("stop_condition", 1, "step_count:1", "tool_call:done")),
        "BOUNDED_STOP", "stop_condition"),
    # -- precedence ----------------------------------------------------------------------
    Row("cause tool_error fails", timed(started(stop_when=[{"kind": "custom", "name": "stopOnToolError", "role": "bound"}]),
                                        step(0, ("a", "error")), ended("tool_error", 1, "custom:stopOnToolError")),
        "FAILED", "tool_error"),
    Row("a tool error in L fails whatever the cause", timed(started(stop_when=[{"kind": "step_count", "count": 1}]),
                                                            step(0, ("a", "error")), ended("stop_condition", 1, "step_count:1")),
        "FAILED", "tool_error"),
    Row("cause error fails", timed(started(), step(0, ("a", "result")), ended("error", 1, error_name="APICallError")),
        "FAILED", "error"),
    Row("an earlier, recovered tool error only counts in evidence",
        timed(started(), step(0, ("a", "error")), step(1), ended("natural_finish", 2)),
        "VERIFYING", "natural_finish", evidence={"tool_errors": 1}),
    Row("approval routed: waiting", timed(started(), step(0, ("pay", "approval_requested")),
                                          ended("approval_required", 1, approval=approval())),
        "WAITING", "approval_required"),
    Row("approval without owner/deadline/token: unrouted", timed(started(), step(0, ("pay", "approval_requested")),
                                                                 ended("approval_required", 1, approval=approval(routed=False))),
        "WAITING_UNROUTED", "approval_required"),
    Row("approval beats a disagreement", timed(started(), step(0, ("pay", "approval_requested")),
                                               ended("approval_required", 5, approval=approval())),
        "WAITING", "approval_required", evidence={"disagreements": ["step_count_mismatch"]}),
    Row("failure beats approval", timed(started(), step(0, ("pay", "approval_requested"), ("a", "error")),
                                        ended("approval_required", 1, approval=approval())),
        "FAILED", "tool_error"),
    Row("timeout is stuck even when a bound fired",
        timed(started(stop_when=CAP3), *steps(3), ended("timeout", 3, "step_count:3", error_name="TimeoutError")),
        "STUCK", "timeout"),
    Row("timeout beats a disagreement", timed(started(), *steps(2), ended("timeout", 7, error_name="TimeoutError")),
        "STUCK", "timeout"),
    Row("abort is a bounded stop", timed(started(), *steps(2), ended("aborted", 2, error_name="AbortError")),
        "BOUNDED_STOP", "aborted"),
    # -- disagreements -------------------------------------------------------------------
    Row("cause_mismatch", timed(started(), step(0, ("done", "result")), ended("natural_finish", 1)),
        "UNCERTAIN", "cause_mismatch", evidence={"derived_cause": "stop_condition", "reported_cause": "natural_finish"}),
    Row("fired_mismatch", timed(started(), step(0, ("done", "result")), ended("stop_condition", 1, "tool_call:done", "step_count:20")),
        "UNCERTAIN", "fired_mismatch"),
    Row("fired_mismatch: custom id the policy does not declare",
        timed(started(), step(0, ("done", "result")), ended("stop_condition", 1, "tool_call:done", "custom:mine")),
        "UNCERTAIN", "fired_mismatch"),
    Row("step_count_mismatch", timed(*natural[:3], ended("natural_finish", 3)), "UNCERTAIN", "step_count_mismatch"),
    Row("policy_overrun: 21 steps under isStepCount(20)",
        timed(started(), *steps(21), ended("stop_condition", 21, "step_count:20")),
        "UNCERTAIN", "cause_mismatch", evidence={"disagreements": ["cause_mismatch", "fired_mismatch", "policy_overrun"]}),
    Row("policy_overrun: hasToolCall only looks at the last step",
        timed(started(), step(0, ("done", "result")), step(1, ("lookup", "result")), step(2), ended("natural_finish", 3)),
        "UNCERTAIN", "policy_overrun"),
    Row("policy_unknown: stop_condition without run_started",
        timed(*steps(20), ended("stop_condition", 20, "step_count:20")),
        "UNCERTAIN", "policy_unknown"),
    Row("step_gap", timed(started(), step(0, ("a", "result")), step(2), ended("natural_finish", 2)),
        "UNCERTAIN", "step_gap"),
    Row("step_gap: first step not 0", timed(started(), step(1), ended("natural_finish", 1)), "UNCERTAIN", "step_gap"),
    Row("cause_not_recorded", timed(started(), *steps(2), ended("unknown", 2)),
        "UNCERTAIN", "cause_not_recorded", evidence={"disagreements": ["cause_not_recorded"]}),
    Row("cause unknown where the steps show a cause: two disagreements",
        timed(started(), step(0, ("done", "result")), ended("unknown", 1)),
        "UNCERTAIN", "cause_mismatch", evidence={"disagreements": ["cause_mismatch", "cause_not_recorded"]}),
    Row("tool_error_unseen (FAILED still wins)", timed(started(), *steps(1), step(1), ended("tool_error", 2)),
        "FAILED", "tool_error", evidence={"disagreements": ["tool_error_unseen"]}),
    Row("isLoopFinished never fires: a stop_condition under it is unexplained",
        timed(started(stop_when=[{"kind": "loop_finished"}]), *steps(3), ended("stop_condition", 3)),
        "UNCERTAIN", "cause_mismatch"),
    Row("isStepCount is equality: count 0 never fires",
        timed(started(stop_when=[{"kind": "step_count", "count": 0}]), *steps(2), ended("stop_condition", 2, "step_count:0")),
        "UNCERTAIN", "cause_mismatch"),
    Row("the SDK evaluates after a content-filter step whose calls were all denied",
        timed(started(stop_when=[{"kind": "tool_call", "tools": ["lookup"]}]),
              step(0, ("lookup", "denied"), finish="content-filter"), ended("stop_condition", 1, "tool_call:lookup")),
        "VERIFYING", "stop_condition", evidence={"derived_cause": "stop_condition"}),
    Row("an interrupted step is never evaluated: natural finish",
        timed(started(stop_when=[{"kind": "step_count", "count": 1}]),
              step(0, ("lookup", "result"), finish="interrupted"), ended("natural_finish", 1)),
        "VERIFYING", "natural_finish"),
    Row("conditions are not evaluated after a step with a pending call",
        timed(started(stop_when=[{"kind": "step_count", "count": 1}]), step(0, ("done", "pending")), ended("unexecuted_tool", 1)),
        "VERIFYING", "unexecuted_tool"),
    # -- rule 2b: a provider error mid-step -------------------------------------------------
    Row("2b: a step that finished with error derives error",
        timed(started(), step(0, ("lookup", "result")), step(1, finish="error"), ended("error", 2, error_name="AI_APICallError")),
        "FAILED", "error", evidence={"derived_cause": "error", "disagreements": []}),
    Row("2b: an error finish reported as a natural finish is a cause_mismatch, never complete",
        timed(started(), step(0, ("lookup", "result")), step(1, finish="error"), ended("natural_finish", 2), receipt("rc1")),
        "UNCERTAIN", "cause_mismatch", evidence={"derived_cause": "error"}),
    Row("2b: error with settled calls in the same step still derives error",
        timed(started(), step(0, ("lookup", "result"), finish="error"), ended("error", 1, error_name="AI_APICallError")),
        "FAILED", "error", evidence={"derived_cause": "error", "fired": []}),
    # -- section 11: aborts and timeouts inside tools --------------------------------------
    Row("an abort inside a tool: cancelled, not a tool error (FAILED does not win)",
        timed(started(), step(0, ("lookup", "result")), step(1, ("slow", "cancelled")), ended("aborted", 2, error_name="AbortError")),
        "BOUNDED_STOP", "aborted", evidence={"tool_errors": 0, "disagreements": []}),
    Row("a timeout inside a tool: cancelled, the cause decides (STUCK timeout)",
        timed(started(), step(0, ("slow", "cancelled")), ended("timeout", 1, error_name="TimeoutError")),
        "STUCK", "timeout", evidence={"tool_errors": 0}),
    Row("an abort inside a tool after which the SDK's condition fired: still aborted, not a completion",
        timed(started(stop_when=[{"kind": "tool_call", "tools": ["slow"]}]), step(0, ("slow", "cancelled")),
              ended("aborted", 1, error_name="AbortError")),
        "BOUNDED_STOP", "aborted", evidence={"derived_cause": "stop_condition", "tool_errors": 0}),
    Row("cause tool_error with only a cancelled call: tool_error_unseen",
        timed(started(), step(0, ("slow", "cancelled")), ended("tool_error", 1)),
        "FAILED", "tool_error", evidence={"disagreements": ["tool_error_unseen"]}),
    # -- provider-executed calls, as the SDK counts them ---------------------------------------
    Row("a provider-executed call counts for hasToolCall",
        timed(started(stop_when=[{"kind": "tool_call", "tools": ["web_search"]}]),
              step(0, ("lookup", "result"), ("web_search", "result", "provider")),
              ended("stop_condition", 1, "tool_call:web_search")),
        "VERIFYING", "stop_condition", evidence={"derived_cause": "stop_condition", "fired": ["tool_call:web_search"]}),
    Row("only provider-executed calls, all with results: the loop ends, a natural finish",
        timed(started(stop_when=[{"kind": "step_count", "count": 1}]),
              step(0, ("web_search", "result", "provider"), finish="stop"), ended("natural_finish", 1)),
        "VERIFYING", "natural_finish", evidence={"derived_cause": "natural_finish", "disagreements": []}),
    Row("a deferred provider-executed call: the SDK evaluates after it",
        timed(started(stop_when=[{"kind": "step_count", "count": 1}]),
              step(0, ("code_run", "pending", "provider")), ended("stop_condition", 1, "step_count:1")),
        "BOUNDED_STOP", "stop_condition", evidence={"derived_cause": "stop_condition"}),
    Row("a pending provider-executed call beside a client call left pending: unexecuted_tool",
        timed(started(), step(0, ("done", "pending"), ("code_run", "pending", "provider")), ended("unexecuted_tool", 1)),
        "VERIFYING", "unexecuted_tool", evidence={"disagreements": []}),
    # -- section 11: segment_started (a segment's own policy) ------------------------------
    Row("a resume under generateText's one-step default, told by segment_started",
        timed(started(), step(0, ("pay", "approval_requested")), ended("approval_required", 1, approval=approval()),
              resolved(), segment_started(1, [{"kind": "step_count", "count": 1}]),
              step(0, ("lookup", "result"), seg=1), ended("stop_condition", 1, "step_count:1", seg=1)),
        "BOUNDED_STOP", "stop_condition", evidence={"fired": ["step_count:1"], "disagreements": []}),
    Row("the same resume without segment_started: the run's policy cannot explain it",
        timed(started(), step(0, ("pay", "approval_requested")), ended("approval_required", 1, approval=approval()),
              resolved(), step(0, ("lookup", "result"), seg=1), ended("stop_condition", 1, "step_count:1", seg=1)),
        "UNCERTAIN", "cause_mismatch"),
    Row("a segment's policy applies to that segment only",
        timed(started(stop_when=CAP3), segment_started(0, [{"kind": "step_count", "count": 1}]),
              step(0, ("lookup", "result")), ended("stop_condition", 1, "step_count:1"),
              *steps(3, seg=1), ended("stop_condition", 3, "step_count:3", seg=1)),
        "BOUNDED_STOP", "stop_condition", evidence={"disagreements": []}),
    Row("segment_started with a null policy: the run's",
        timed(started(stop_when=CAP3), segment_started(0, policy=False), *steps(3), ended("stop_condition", 3, "step_count:3")),
        "BOUNDED_STOP", "stop_condition"),
    Row("segment_started after the segment's first step: ignored and counted",
        timed(started(stop_when=CAP3), step(0, ("lookup", "result")), segment_started(0, [{"kind": "step_count", "count": 1}]),
              *steps(3)[1:], ended("stop_condition", 3, "step_count:3")),
        "BOUNDED_STOP", "stop_condition", evidence={"ignored": {"late_segment_started": 1}}),
    # -- section 11: run_active ------------------------------------------------------------
    Row("a 400 s tool with run_active every 100 s is never STUCK",
        [*timed(started(), step(0, ("lookup", "result"))), active(ts=1_101_000), active(ts=1_201_000),
         active(ts=1_301_000), step(1, ts=1_401_000), ended("natural_finish", 2, ts=1_401_500)],
        "VERIFYING", "natural_finish", path=("RUNNING", "VERIFYING")),
    Row("run_active is activity and nothing else: silence after it still times out",
        timed(started(), step(0, ("lookup", "result")), active()), "STUCK", "no_progress", advance_s=300),
    Row("run_active after STUCK is not progress",
        [*timed(started(), step(0, ("lookup", "result"))), active(ts=1_400_000)],
        "STUCK", "no_progress", path=("RUNNING", "STUCK")),
    # -- section 11: events_dropped --------------------------------------------------------
    Row("lost events: the verdict is UNCERTAIN producer_dropped, the count in evidence",
        timed(started(), step(0, ("lookup", "result")), dropped(3), step(4), ended("natural_finish", 5), receipt("rc1")),
        "UNCERTAIN", "producer_dropped", path=("RUNNING", "UNCERTAIN"),
        evidence={"events_dropped": 3, "disagreements": ["producer_dropped", "step_count_mismatch", "step_gap"]}),
    Row("lost run_ended: UNCERTAIN when the silence times out, never STUCK",
        timed(started(), step(0, ("lookup", "result")), dropped(2)), "UNCERTAIN", "producer_dropped",
        advance_s=3600, path=("RUNNING", "UNCERTAIN"), evidence={"events_dropped": 2}),
    Row("a loss is not blamed on the agent: it beats FAILED",
        timed(started(), step(0, ("lookup", "error")), dropped(1), ended("tool_error", 1)),
        "UNCERTAIN", "producer_dropped"),
    Row("a loss reported after a verdict overturns it",
        timed(*natural, dropped(1)), "UNCERTAIN", "producer_dropped", path=("RUNNING", "VERIFYING", "UNCERTAIN"),
        evidence={"disagreements": ["producer_dropped"]}),
    Row("a loss reported after STUCK: the silence was the loss",
        [*timed(started(), step(0, ("lookup", "result"))), dropped(4, ts=1_500_000)],
        "UNCERTAIN", "producer_dropped", path=("RUNNING", "STUCK", "UNCERTAIN"), evidence={"events_dropped": 4}),
    Row("a loss reported after another UNCERTAIN verdict: no transition (same state), the evidence names it",
        timed(started(), step(0, ("done", "result")), ended("natural_finish", 1), dropped(2)),
        "UNCERTAIN", "cause_mismatch", path=("RUNNING", "UNCERTAIN"),
        evidence={"disagreements": ["cause_mismatch", "producer_dropped"], "events_dropped": 2}),
    Row("losses add up, and a later segment stays UNCERTAIN",
        timed(*natural, dropped(1), dropped(2), step(0, seg=1), ended("natural_finish", 1, seg=1)),
        "UNCERTAIN", "producer_dropped", path=("RUNNING", "VERIFYING", "UNCERTAIN", "RUNNING", "UNCERTAIN"),
        evidence={"events_dropped": 3}),
    # -- duplicates and late events ------------------------------------------------------
    Row("duplicate step ignored and counted", timed(started(), step(0, ("a", "result")), step(0, ("zzz", "error")), step(1), ended("natural_finish", 2)),
        "VERIFYING", "natural_finish", evidence={"ignored": {"duplicate_step": 1}, "tool_errors": 0, "disagreements": []}),
    Row("step after its segment ended: recorded, no state change", timed(*natural, step(2)),
        "VERIFYING", "natural_finish", path=("RUNNING", "VERIFYING")),
    Row("second run_ended for a segment: recorded, no state change",
        timed(*natural, ended("error", 2)), "VERIFYING", "natural_finish", path=("RUNNING", "VERIFYING")),
    # -- segments and approvals --------------------------------------------------------
    Row("step counts restart per segment",
        timed(started(stop_when=CAP3), *steps(2), step(2, ("pay", "approval_requested")),
              ended("approval_required", 3, approval=approval()), resolved(),
              *steps(3, seg=1), ended("stop_condition", 3, "step_count:3", seg=1)),
        "BOUNDED_STOP", "stop_condition",
        path=("RUNNING", "WAITING", "RUNNING", "BOUNDED_STOP"), evidence={"segments": 2, "step_count": 3}),
    Row("a count that spans segments does not fire",
        timed(started(stop_when=CAP3), *steps(1), step(1, ("pay", "approval_requested")),
              ended("approval_required", 2, approval=approval()), resolved(),
              *steps(2, seg=1), ended("stop_condition", 2, "step_count:3", seg=1)),
        "UNCERTAIN", "cause_mismatch"),
    Row("unrouted approval routed later", timed(started(), step(0, ("pay", "approval_requested")),
                                                ended("approval_required", 1, approval=approval(routed=False)), routed()),
        "WAITING", "approval_routed"),
    Row("approval for another id ignored", timed(started(), step(0, ("pay", "approval_requested")),
                                                 ended("approval_required", 1, approval=approval(routed=False)), routed("other")),
        "WAITING_UNROUTED", "approval_required", evidence={"ignored": {"unmatched_approval": 1}}),
    Row("approval deadline passes", timed(started(), step(0, ("pay", "approval_requested")),
                                          ended("approval_required", 1, approval=approval(deadline_ts=1_100_000))),
        "STUCK", "approval_expired", advance_s=100),
    Row("approval resolved (denied): running again", timed(started(), step(0, ("pay", "approval_requested")),
                                                           ended("approval_required", 1, approval=approval()), resolved(approved=False)),
        "RUNNING", "approval_resolved"),
    Row("a step of a new segment after a verdict", timed(*natural, step(0, seg=1)), "RUNNING", "progress"),
    # -- inactivity ----------------------------------------------------------------------
    Row("no activity for inactivity_timeout_s", timed(started(), *steps(2)), "STUCK", "no_progress", advance_s=300),
    Row("inactivity_timeout_s from the policy", timed(started(inactivity_timeout_s=5), *steps(2)), "STUCK", "no_progress", advance_s=5),
    Row("a step after STUCK: running again", timed(started(inactivity_timeout_s=5), step(0, ("a", "result"))) + [step(1, ("a", "result"), ts=1_100_000)],
        "RUNNING", "progress", path=("RUNNING", "STUCK", "RUNNING")),
    Row("receipts are not activity", timed(started(inactivity_timeout_s=5), step(0, ("a", "result")), receipt("x")),
        "STUCK", "no_progress", advance_s=10),
    Row("unrouted approvals do not time out", timed(started(inactivity_timeout_s=5), step(0, ("pay", "approval_requested")),
                                                    ended("approval_required", 1, approval=approval(routed=False))),
        "WAITING_UNROUTED", "approval_required", advance_s=3600),
    # -- runs with partial records -------------------------------------------------------
    Row("no run_started: default policy (step_count 20)",
        timed(*steps(3), step(3), ended("natural_finish", 4)), "VERIFYING", "natural_finish",
        evidence={"reported_cause": "natural_finish"}),
    Row("late run_started sets the policy from then on",
        timed(step(0, ("a", "result")), started(stop_when=[{"kind": "step_count", "count": 2}]),
              step(1, ("a", "result")), ended("stop_condition", 2, "step_count:2")),
        "BOUNDED_STOP", "stop_condition"),
    Row("run_ended as the first event: started, then the verdict", timed(ended("aborted", 0)),
        "BOUNDED_STOP", "aborted", path=("RUNNING", "BOUNDED_STOP")),
]


@pytest.mark.parametrize("row", ROWS, ids=[r.rule for r in ROWS])
def test_rule(row: Row) -> None:
    """Each rule of docs/contract.md section 5 yields its state and reason."""
    out, evidence = run(row.events, row.advance_s)
    assert out, "no transition at all"
    last = out[-1]
    assert (last["to_state"], last["reason"]) == (row.state, row.reason), [
        (t["to_state"], t["reason"]) for t in out
    ]
    if row.path is not None:
        assert tuple(t["to_state"] for t in out) == row.path
    for key, want in (row.evidence or {}).items():
        assert evidence[key] == want, key
    assert [t["seq"] for t in out] == list(range(1, len(out) + 1))


def test_receipts_of_a_run_that_never_appears_are_orphans_after_retention() -> None:
    """A receipt never starts a run; after retention it is dropped and counted as an orphan."""
    replay = Replay()
    for e in timed(receipt("a"), receipt("b")):
        assert replay.feed(decode_input(msgspec.json.encode(e))) == []
    assert "r" in replay.states
    assert replay.finish(7 * 86400 + 5) == []
    assert "r" not in replay.states
    assert replay.notes[("receipt", "orphan")] == 2


def test_timer_transition_ts_is_the_deadline() -> None:
    """A timer's transition carries its deadline as ts and the clock as emitted_ts."""
    out, _ = run(timed(*natural), advance_s=3600)
    expired = out[-1]
    assert expired["reason"] == "receipt_window_expired"
    run_ended_ts = timed(*natural)[-1]["ts"]
    assert expired["ts"] == run_ended_ts + WINDOW_S * 1000
    assert expired["emitted_ts"] == run_ended_ts + 3600 * 1000


def test_a_run_id_back_after_retention_continues_its_seq() -> None:
    """Retention drops a settled run but keeps its tomb (run id, last seq): the run id's seq never repeats."""
    settings = Settings(retention_s=3600, seq_memory_s=86400)
    replay = Replay(settings)
    first = [t for e in timed(*natural) for t in replay.feed(decode_input(msgspec.json.encode(e)))]
    first += replay.advance_to(replay.clock + 3_600_000)  # the receipt window expires: FALSE_COMPLETE
    last_seq = first[-1].seq
    assert [t.seq for t in first] == list(range(1, last_seq + 1))
    replay.advance_to(replay.clock + 3_600_000 + 1000)  # retention: dropped, but a tomb is kept
    tomb = replay.states["r"]
    assert tomb.tomb and tomb.seq == last_seq and tomb.health is None
    again = [t for e in timed(*natural, start=replay.clock + 1000)
             for t in replay.feed(decode_input(msgspec.json.encode(e)))]
    assert [t.seq for t in again] == list(range(last_seq + 1, last_seq + 1 + len(again)))
    assert again[0].from_state is None and again[0].to_state == "RUNNING"
    # Once seq_memory_s has passed after the drop, the tomb goes too (a run id may then start at 1).
    replay.advance_to(replay.clock + 2 * 3_600_000 + 86_400_000 + 5000)
    assert "r" not in replay.states


def test_a_receipt_holder_that_never_started_leaves_no_tomb() -> None:
    replay = Replay(Settings(retention_s=60))
    replay.feed(decode_input(msgspec.json.encode(receipt("a", ts=1000))))
    replay.finish(61)
    assert "r" not in replay.states


def test_final_counts_hold_every_run_without_keeping_transitions() -> None:
    """``final_counts`` (what ``--summary`` prints) counts runs by their last transition as ``final``
    does, through retention: runs dropped to a tomb, forgotten, and a run id that comes back."""
    from collections import Counter

    from loopwarden.simulate import fleet

    settings = Settings(retention_s=900, seq_memory_s=1800)
    lean, full = Replay(settings), Replay(settings, keep_final=True)
    events = [decode_input(m.value) for m in fleet(400, seed=3, rate=0.5) if m.valid]
    back = timed(*natural, start=events[0].ts + 2 * 900_000)  # run "r" again, after run "r"'s retention
    first = timed(*natural, start=events[0].ts)
    events = sorted([*events, *(decode_input(msgspec.json.encode(e)) for e in (*first, *back))], key=lambda e: e.ts)
    checked = 0
    for i, ev in enumerate(events):
        assert lean.feed(ev) == full.feed(ev)
        if i % 97 == 0:
            assert lean.final_counts() == Counter((t.to_state, t.reason) for t in full.final.values())
            checked += 1
    for advance in (600, 1800, 7200):
        assert lean.finish(advance) == full.finish(advance)
        assert lean.final_counts() == Counter((t.to_state, t.reason) for t in full.final.values())
    assert lean.final == {} and len(full.final) == len({e.run_id for e in events})
    assert checked > 10
    # All but approvals still waiting for their owner were dropped, and their tombs forgotten.
    assert {s.health for s in lean.states.values()} == {"WAITING"}
    assert sum(lean.final_counts().values()) > 5 * len(lean.states)
