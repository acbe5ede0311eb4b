"""Hypothesis strategies: valid events of every type, and whole plausible fleets of runs."""

from __future__ import annotations

from hypothesis import strategies as st

from loopwarden.codecs import (
    CAUSES,
    FINISH_REASONS,
    RECEIPT_KINDS,
    TOOL_STATUSES,
    Approval,
    ApprovalResolved,
    ApprovalRouted,
    Custom,
    EventsDropped,
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
)

MAX_TS = 2**53 - 1
ident = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=40)
run_ids = st.text("abcdef0123456789-", min_size=1, max_size=12)
ts = st.integers(0, MAX_TS)
small = st.integers(0, 10_000)
tokens = st.none() | st.integers(0, 2**40)
durations = st.floats(min_value=0.001, max_value=366 * 86400, allow_nan=False).filter(lambda x: x > 0)

conditions = st.one_of(
    st.builds(StepCount, count=st.integers(0, 50)),
    st.builds(ToolCallCondition, tools=st.lists(ident, min_size=1, max_size=3).map(tuple)),
    st.just(LoopFinished()),
    st.builds(TokenBudget, max_tokens=st.integers(1, 2**40)),
    st.builds(Custom, name=ident, role=st.sampled_from(["bound", "completion"])),
)
policies = st.builds(
    Policy,
    version=st.text(max_size=20),
    stop_when=st.none() | st.lists(conditions, max_size=4).map(tuple),
    inactivity_timeout_s=durations,
    receipt_window_s=durations,
    required_outcomes=st.lists(st.sampled_from(RECEIPT_KINDS), max_size=3, unique=True).map(tuple),
)
approvals = st.builds(
    Approval,
    approval_id=ident,
    tool_call_id=ident,
    tool_name=ident,
    owner=st.none() | ident,
    deadline_ts=st.none() | ts,
    resume_token=st.none() | ident,
)
tool_calls = st.builds(ToolCall, id=ident, name=ident, status=st.sampled_from(TOOL_STATUSES),
                       provider_executed=st.booleans())
usages = st.builds(Usage, input_tokens=tokens, output_tokens=tokens, total_tokens=tokens)

run_started = st.builds(RunStarted, run_id=run_ids, ts=ts, agent=st.text(min_size=1, max_size=30), policy=policies)
step_finished = st.builds(
    StepFinished, run_id=run_ids, ts=ts, step=small, finish_reason=st.sampled_from(FINISH_REASONS),
    segment=st.integers(0, 5), tool_calls=st.lists(tool_calls, max_size=3).map(tuple), usage=usages,
)


@st.composite
def run_ended(draw):
    cause = draw(st.sampled_from(CAUSES))
    approval = draw(approvals if cause == "approval_required" else st.none() | approvals)
    return RunEnded(
        run_id=draw(run_ids), ts=draw(ts), cause=cause, step_count=draw(small), approval=approval,
        error_name=draw(st.none() | st.text(max_size=20)), segment=draw(st.integers(0, 5)),
        fired=tuple(draw(st.lists(st.text(max_size=30), max_size=3))),
    )


approval_routed = st.builds(
    ApprovalRouted, run_id=run_ids, ts=ts, approval_id=ident, owner=st.none() | ident,
    deadline_ts=st.none() | ts, resume_token=st.none() | ident,
)
approval_resolved = st.builds(ApprovalResolved, run_id=run_ids, ts=ts, approval_id=ident, approved=st.booleans())
evidence_values = st.one_of(st.text(max_size=40), st.booleans(), st.integers(-(2**63), 2**63 - 1),
                            st.floats(allow_nan=False, allow_infinity=False))
outcome_receipt = st.builds(
    OutcomeReceipt, run_id=run_ids, ts=ts, receipt_id=ident, kind=st.sampled_from(RECEIPT_KINDS),
    verifier=st.sampled_from(["destination", "validator", "human"]), verified=st.booleans(),
    evidence=st.dictionaries(st.text(max_size=20), evidence_values, max_size=5),
)
segment_started = st.builds(SegmentStarted, run_id=run_ids, ts=ts, segment=small, policy=st.none() | policies)
run_active = st.builds(RunActive, run_id=run_ids, ts=ts, segment=small, in_=st.sampled_from(["model", "tool"]),
                       tool_call_id=st.none() | ident)
events_dropped = st.builds(EventsDropped, run_id=run_ids, ts=ts, count=st.integers(1, 2**40))
any_event = st.one_of(run_started, step_finished, run_ended(), approval_routed, approval_resolved, outcome_receipt,
                      segment_started, run_active, events_dropped)


# -- fleets: plausible, interleaved runs with small ts steps --------------------------------
@st.composite
def fleet(draw, max_runs: int = 6):
    """A list of input events of several runs, interleaved, with non-decreasing-ish ts.

    Runs follow the emitter's shape (started, steps, ended; approvals; receipts) with
    random faults: missing run_started, duplicates, gaps, wrong causes, late receipts.
    """
    n_runs = draw(st.integers(1, max_runs))
    per_run = []
    for r in range(n_runs):
        run = f"run-{r}"
        events: list = []
        if draw(st.booleans()) or draw(st.booleans()):
            events.append(RunStarted(run_id=run, ts=0, agent="a", policy=draw(policies.filter(lambda p: p.inactivity_timeout_s > 1))))
        for seg in range(draw(st.integers(1, 2))):
            if draw(st.integers(0, 4)) == 0:  # a segment under its own policy
                events.append(SegmentStarted(run_id=run, ts=0, segment=seg, policy=draw(st.none() | policies)))
            n_steps = draw(st.integers(0, 6))
            for i in range(n_steps):
                i_wire = i + (1 if draw(st.integers(0, 20)) == 0 else 0)  # rare gap
                sf = StepFinished(run_id=run, ts=0, step=i_wire, segment=seg,
                                  finish_reason=draw(st.sampled_from(FINISH_REASONS)),
                                  tool_calls=tuple(draw(st.lists(st.builds(ToolCall, id=st.just("t"), name=st.sampled_from(["done", "lookup", "pay"]), status=st.sampled_from(TOOL_STATUSES), provider_executed=st.integers(0, 4).map(lambda n: n == 0)), max_size=2))),
                                  usage=draw(usages))
                if draw(st.integers(0, 8)) == 0:  # a long model call or tool
                    events.append(RunActive(run_id=run, ts=0, segment=seg, in_="tool", tool_call_id="t"))
                if draw(st.integers(0, 25)) == 0:  # the producer lost events
                    events.append(EventsDropped(run_id=run, ts=0, count=draw(st.integers(1, 5))))
                events.append(sf)
                if draw(st.integers(0, 10)) == 0:
                    events.append(sf)  # duplicate delivery
            if draw(st.integers(0, 5)):
                cause = draw(st.sampled_from(CAUSES))
                appr = Approval(approval_id=f"ap-{run}-{seg}", tool_call_id="t", tool_name="pay",
                                owner=draw(st.none() | st.just("o")), deadline_ts=draw(st.none() | st.integers(0, 4000)),
                                resume_token=draw(st.none() | st.just("k")))
                events.append(RunEnded(run_id=run, ts=0, cause=cause, step_count=n_steps, segment=seg,
                                       approval=appr if cause == "approval_required" else None, error_name=None,
                                       fired=tuple(draw(st.lists(st.sampled_from(["step_count:20", "tool_call:done", "custom:x"]), max_size=2)))))
                if cause == "approval_required":
                    if draw(st.booleans()):
                        events.append(ApprovalRouted(run_id=run, ts=0, approval_id=appr.approval_id, owner="o", deadline_ts=draw(st.integers(0, 4000)), resume_token="k"))
                    if draw(st.booleans()):
                        events.append(ApprovalResolved(run_id=run, ts=0, approval_id=appr.approval_id, approved=draw(st.booleans())))
        for k in range(draw(st.integers(0, 2))):
            events.append(OutcomeReceipt(run_id=run, ts=0, receipt_id=f"rc-{run}-{k % 2}", kind=draw(st.sampled_from(RECEIPT_KINDS)),
                                         verifier="destination", verified=draw(st.booleans())))
        per_run.append(events)
    # Interleave runs (each run keeps its own order) and stamp ts with small random gaps.
    order = draw(st.permutations([r for r, evs in enumerate(per_run) for _ in evs]))
    cursors = [0] * n_runs
    clock = 1_000
    out = []
    for r in order:
        ev = per_run[r][cursors[r]]
        cursors[r] += 1
        clock += draw(st.integers(0, 400_000))
        out.append(_with_ts(ev, clock))
    return out


def _with_ts(ev, ts_ms: int):
    import msgspec

    return msgspec.structs.replace(ev, ts=ts_ms)
