"""The per-run state machine: fold events into a compact :class:`RunState`.

Both shells (the Kafka worker and offline replay) call :func:`apply` for each
event and :func:`fire_next` / :func:`next_deadline` for timers. Nothing here does
I/O or reads a clock: ``now_ms`` is an argument. ``apply`` updates the state it
is given in place (the caller owns it) and returns the transitions and notes
that the shell must publish and count.

Notes are ``(kind, label)`` pairs from bounded sets, for metrics:
``("ignored", <why>)``, ``("disagreement", <name>)``, ``("cause", <derived cause>)``,
``("reported_cause", <cause>)``, ``("receipt", on_time|late|negative|held|duplicate|orphan)``,
``("timer", <kind>)``, ``("evicted", <state>)``, and ``("receipt", untrusted_<why>)`` for an untrusted receipt
(``untrusted_stale``, decided here: a receipt of an earlier occurrence of the run id, docs/contract.md section 10).
"""

from __future__ import annotations

from bisect import bisect_right
from operator import itemgetter

from msgspec import UNSET, Struct, UnsetType

from loopwarden.codecs.events import (
    Approval,
    ApprovalResolved,
    ApprovalRouted,
    EventsDropped,
    Evidence,
    HealthTransition,
    InputEvent,
    OutcomeExpected,
    OperatorAction,
    OutcomeReceipt,
    Policy,
    RecoveryAction,
    RunActive,
    RunEnded,
    RunStarted,
    SegmentStarted,
    StepFinished,
)
from loopwarden.codecs.states import STATE_NAMES, STATE_TIMERS
from loopwarden.rules.conditions import (
    _BY_ID,
    SETTLED_STATUSES,
    CompiledPolicy,
    compile_policy,
    derive_cause,
    intern_policy,
    loop_statuses,
)
from loopwarden.rules.precedence import (
    FALSE_COMPLETE,
    VERIFIED_COMPLETE,
    Facts,
    receipt_verdict,
    verdict,
)
from loopwarden.rules.recovery import decide
from loopwarden.rules.trust import TrustedAction, TrustedReceipt, UntrustedAction, UntrustedReceipt

Note = tuple[str, str]
_lo = itemgetter(0)

DEFAULT_RETENTION_S = 7 * 86400
# How long a dropped run's last seq is remembered (its tomb), so the run id's seq never repeats
# while consumers may still hold (run_id, seq) pairs to drop repeats by.
DEFAULT_SEQ_MEMORY_S = 30 * 86400
# Bounds that keep one run's state small whatever a producer sends. Repeats stay safe past them:
# steps below the gaps forgotten are ignored as untracked (never counted again), and receipts past
# MAX_RECEIPT_IDS distinct ids still apply their kind (a set: a repeat changes nothing) but are
# counted as untracked, never as a new on-time, late or negative receipt.
MAX_GAPS = 1024
MAX_RECEIPT_IDS = 256
MAX_HISTORY = 32
MAX_FAILED_TOOLS = 32
MAX_REQUESTS = 32
# Boundary facts the steps cannot show: not checked against the derived cause.
UNCHECKED_CAUSES = ("aborted", "timeout", "error", "tool_error")
# States whose run has nothing left to wait for: dropped after retention. The others (RUNNING, WAITING,
# VERIFYING) have their own timer (loopwarden.codecs.states: a row's ``timer``), which ends in one of these.
TIMERLESS = (None, *(s for s in STATE_NAMES if s not in STATE_TIMERS))


class Settings(Struct, frozen=True):
    """Engine-wide knobs (per-run knobs travel in the run's Policy)."""

    retention_s: float = DEFAULT_RETENTION_S
    seq_memory_s: float = DEFAULT_SEQ_MEMORY_S


DEFAULT_SETTINGS = Settings()


class Segment(Struct, gc=False):
    """Accumulated facts of one open segment; no step records are kept."""

    steps_seen: int = 0
    max_step: int = -1
    gaps: list[tuple[int, int]] = []  # skipped step ranges, inclusive, not yet seen; sorted
    step_gap: bool = False
    tokens: int = 0
    tool_errors: int = 0
    stop_step: int | None = None  # first step at which the policy fired
    # the last step L (highest step number)
    finish_reason: str | None = None
    statuses: tuple[str, ...] = ()  # status of each tool call of L
    fired: tuple[str, ...] = ()  # policy evaluated at L
    # Steps <= this were in gaps forgotten past MAX_GAPS (seen or not, nobody knows): never counted again.
    forgot_hi: int = -1
    # The segment's own stop policy (segment_started), None: the run's. Used for stop_when and the
    # receipt window; the inactivity timeout stays the run's (timers are per run).
    policy: Policy | None = None


class Recovery(Struct, gc=False):
    """What bounded recovery keeps about a run (docs/recovery.md). Its policy is the run's policy's
    ``recovery``: the shell filled in the agent's default before the core saw the run_started."""

    # The job this run is an attempt of as its run_started declared it (None: it declared none, its
    # evidence names no job, and a decision names the run itself as the job), its attempt, and the
    # attempt it replaces.
    job_id: str | None = None
    attempt: int = 1
    recovers: str | None = None
    # Names of the run's failed tool calls (status error), at most MAX_FAILED_TOOLS distinct, and how many
    # failed calls they name: a failed call not named (past the bound, or before the run had this record)
    # counts as a tool that is not idempotent, so FAILED is then never restarted on its own.
    failed_tools: list[str] = []
    named_errors: int = 0
    # This attempt had its automatic action, or a person's retry: at most one automatic action per attempt.
    acted: bool = False
    # A person's abandon (no automatic action follows) and acknowledge: ``person:<key id>[/<actor>]``.
    closed_by: str | None = None
    acknowledged_by: str | None = None
    # Request ids of the operator actions seen (the last MAX_REQUESTS): a repeated one is ignored.
    requests: list[str] = []


class RunState(Struct, gc=False):
    """Everything loopwarden keeps about one run."""

    run_id: str
    health: str | None = None
    seq: int = 0
    agent: str | None = None
    policy: Policy | None = None  # None until run_started: the default policy applies
    last_activity_ts: int | None = None  # last event on agent.steps
    last_seen_ts: int = 0  # last event on either topic (retention)
    open: dict[int, Segment] = {}
    ended: list[int] = []
    current: int = -1  # highest segment index seen
    tool_errors: int = 0  # whole run
    # the verdict of the last ended segment
    reported_cause: str | None = None
    derived_cause: str | None = None
    fired: tuple[str, ...] = ()
    disagreements: tuple[str, ...] = ()
    ended_step_count: int = 0
    ended_finish_reason: str | None = None
    approval: Approval | None = None
    approval_pending: bool = False
    verify_deadline_ts: int | None = None
    receipt_ids: list[str] = []
    verified_kinds: list[str] = []
    negative_kinds: list[str] = []
    ignored: dict[str, int] = {}
    # (seq, ts, to_state, reason) of the last MAX_HISTORY transitions, for the read API
    history: list[tuple[int, int, str, str]] = []
    # A tomb: what is left of a run dropped after retention (run_id, seq, last_seen_ts = when it was
    # dropped) until seq_memory_s has passed; the run id's next transition continues its seq.
    tomb: bool = False
    # Events of the run its producer reported lost (events_dropped), summed: from the first such
    # report on, the run's verdicts are UNCERTAIN (producer_dropped), never STUCK through the silence.
    dropped: int = 0
    # docs/contract.md section 10: receipts kept as untrusted (ids, at most MAX_RECEIPT_IDS) and the run's
    # declared expectations (ids, likewise): evidence only, they decide nothing.
    untrusted_receipt_ids: list[str] = []
    expectation_ids: list[str] = []
    # How each trusted receipt was trusted (receipt id -> channel:<topic> | key:<key_id>), when a shell
    # decided trust (docs/receipts.md); at most MAX_RECEIPT_IDS, like receipt_ids.
    receipt_trust: dict[str, str] = {}
    # docs/contract.md section 10, "One occurrence": when this occurrence of the run id started (the ts of
    # its first event on agent.steps, or of its run_started if earlier). A receipt stamped before it
    # answers an earlier occurrence: kept as untrusted_stale, it counts for nothing.
    started_ts: int | None = None
    # Receipts counted before the occurrence started, (receipt id, kind, verified, stamp): their
    # occurrence is known only at the start, which refuses the stale ones. Empty once started.
    held: list[tuple[str, str, bool, int]] = []
    # docs/contract.md section 12 (docs/recovery.md): the run's part in bounded recovery; None for a run that
    # declared no job while nothing needed one (no failed tool call named for its policy, no action decided,
    # no person's action): most runs, whose stored bytes then stay as without recovery.
    recovery: Recovery | None = None


class Result(Struct, gc=False):  # never in a reference cycle: one event's output, dropped by the shell
    state: RunState | None
    transitions: list[HealthTransition] = []  # msgspec copies an empty default per instance
    notes: list[Note] = []
    # Recovery actions the transitions (or a person's action) caused, for agent.actions (docs/recovery.md).
    actions: list[RecoveryAction] = []


def unknown_run(state: RunState | None) -> bool:
    """Whether a person's action names a run loopwarden does not hold (never seen, never started, or dropped
    after retention): the shells dead-letter it with the reason ``unknown_run`` rather than make a run of it."""
    return state is None or state.tomb or state.health is None


# -- helpers ------------------------------------------------------------------
def _ms(seconds: float) -> int:
    return int(round(seconds * 1000))


def evidence_of(state: RunState, action_id: str | UnsetType = UNSET) -> Evidence:
    """The evidence a transition of this run would carry now (also served by the read API); ``action_id``: the
    recovery action the transition causes."""
    seg = state.open.get(state.current) if state.open else None
    if seg is not None:  # the current segment is still open
        step_count, finish_reason = seg.steps_seen, seg.finish_reason
    else:
        step_count, finish_reason = state.ended_step_count, state.ended_finish_reason
    # Evidence's fields in their order, positional: msgspec matches keywords one by one, and past 16 of them
    # a Struct's construction takes ~4x as long (the fields of section 12 made it 17).
    fields = (
        state.reported_cause,
        state.derived_cause,
        state.fired,
        step_count,
        len(state.open) + len(state.ended),  # segments
        state.tool_errors,
        finish_reason,
        state.disagreements,
        tuple(state.receipt_ids) if state.receipt_ids else (),
        state.approval,
        dict(state.ignored) if state.ignored else {},
        state.dropped,  # events_dropped
        tuple(state.untrusted_receipt_ids) if state.untrusted_receipt_ids else UNSET,
        tuple(state.expectation_ids) if state.expectation_ids else UNSET,
        dict(state.receipt_trust) if state.receipt_trust else UNSET,
    )
    rec = state.recovery
    if rec is None or (rec.job_id is None and action_id is UNSET):
        return Evidence(*fields)
    # Section 12: job_id and attempt only for a run that declared a job, so other runs' transitions keep their bytes.
    declared = rec.job_id is not None
    return Evidence(*fields, rec.job_id if declared else UNSET, rec.attempt if declared else UNSET, action_id)


assert Evidence.__struct_fields__ == (
    "reported_cause", "derived_cause", "fired", "step_count", "segments", "tool_errors", "finish_reason",
    "disagreements", "receipt_ids", "approval", "ignored", "events_dropped", "untrusted_receipt_ids",
    "expectation_ids", "receipt_trust", "job_id", "attempt", "action_id",
), "evidence_of builds Evidence by position: out of step with its fields"


def _move(state: RunState, res: Result, to: str, reason: str, ts: int, now_ms: int) -> None:
    """Emit a transition unless the run is already in ``to``."""
    if state.health == to:
        return
    seq = state.seq = state.seq + 1
    policy = state.policy
    # decide's first rule, inline: most transitions (RUNNING, VERIFYING) are in no state a policy names
    if policy is not None and (recovery := policy.recovery) is not UNSET and to in recovery.on:
        rec = _recovery(state)
        action = _decide(state, rec, policy, seq, ts, to, reason)
        if action is not None:
            res.actions.append(action)
            evidence = evidence_of(state, action.action_id)
        else:
            evidence = evidence_of(state)
    else:
        evidence = evidence_of(state)
    res.transitions.append(
        HealthTransition(
            run_id=state.run_id,
            seq=seq,
            ts=ts,
            emitted_ts=now_ms,
            agent=state.agent,
            policy_version=policy.version if policy is not None else None,
            from_state=state.health,
            to_state=to,
            reason=reason,
            evidence=evidence,
        )
    )
    state.health = to
    history = state.history
    history.append((seq, ts, to, reason))
    if len(history) > MAX_HISTORY:
        del history[:-MAX_HISTORY]


def _recovery(state: RunState) -> Recovery:
    """The run's recovery record, made when first needed (an action decided, a failed call named for its policy, a
    person's action): a run that never needs one keeps its stored bytes as without recovery."""
    rec = state.recovery
    if rec is None:
        rec = state.recovery = Recovery()
    return rec


def _decide(state: RunState, rec: Recovery, policy: Policy, seq: int, ts: int, to: str, reason: str) -> RecoveryAction | None:
    """The automatic action of the run's transition ``seq`` to ``to``, if its recovery policy calls for one."""
    if rec.acted or rec.closed_by is not None:  # one automatic action per attempt; none after a person's abandon
        return None
    tools: list[str] = rec.failed_tools
    # A failed call not named, or a tool error reported whose failed call never arrived (lost by a producer
    # that did not know it, or told of the loss only after run_ended): no declared tool can vouch for it.
    if state.tool_errors > rec.named_errors or (reason == "tool_error" and not tools):
        tools = [*tools, ""]  # "" is no tool's name (Name has min_length 1): never idempotent
    action = decide(
        run_id=state.run_id, seq=seq, ts=ts, to_state=to, reason=reason, policy=policy.recovery,  # type: ignore[arg-type]
        policy_version=policy.version, agent=state.agent, job_id=rec.job_id, attempt=rec.attempt, failed_tools=tools,
        producer_dropped=state.dropped > 0,
    )
    if action is not None:
        rec.acted = True
    return action


def _ignore(state: RunState, res: Result, why: str) -> None:
    state.ignored[why] = state.ignored.get(why, 0) + 1
    res.notes.append(("ignored", why))


def _activity(state: RunState, res: Result, ts: int, now_ms: int, at: int) -> None:
    """Activity of the run, placed at ``at`` (the clock when it was applied: ``ts`` or later)."""
    last = state.last_activity_ts
    if last is None or at > last:
        state.last_activity_ts = at
    if at > state.last_seen_ts:
        state.last_seen_ts = at
    if state.health is None:
        _start(state, res, ts, now_ms)


def _start(state: RunState, res: Result, ts: int, now_ms: int) -> None:
    """The occurrence starts at ``ts``: receipts held for it that are stamped earlier were an earlier
    occurrence's (docs/contract.md section 10), and no longer count."""
    state.started_ts = ts
    held = state.held
    if held:
        state.held = []
        if any(stamp < ts for _, _, _, stamp in held):
            state.verified_kinds, state.negative_kinds = [], []
            for rid, kind, verified, stamp in held:
                if stamp < ts:
                    _refuse_stale(state, res, rid)
                    if rid in state.receipt_ids:
                        state.receipt_ids.remove(rid)
                    state.receipt_trust.pop(rid, None)
                else:
                    kinds = state.verified_kinds if verified else state.negative_kinds
                    if kind not in kinds:
                        kinds.append(kind)
    _move(state, res, "RUNNING", "started", ts, now_ms)


def _stamp(receipt: OutcomeReceipt) -> int:
    """When the occurrence a receipt answers had started at the latest: its signed ``run_started_ts``,
    else its own ``ts`` (a receipt is made after the run it answers started)."""
    started = receipt.run_started_ts
    return receipt.ts if started is UNSET else started


def _refuse_stale(state: RunState, res: Result, rid: str) -> None:
    _ignore(state, res, "stale_receipt")
    res.notes.append(("receipt", "untrusted_stale"))
    ids = state.untrusted_receipt_ids
    if rid not in ids and len(ids) < MAX_RECEIPT_IDS:
        ids.append(rid)


def _receipts_verdict(state: RunState) -> str | None:
    verified, negative = state.verified_kinds, state.negative_kinds
    if not verified and not negative:
        return None  # what receipt_verdict says with no receipts, whatever is required
    policy = state.policy
    required = policy.required_outcomes if policy is not None else ()
    if not required:  # receipt_verdict's rule, inline: without it apply takes ~3 % longer (docs/architecture.md)
        return VERIFIED_COMPLETE if verified else FALSE_COMPLETE
    return receipt_verdict(verified, negative, required)


# -- event handlers -----------------------------------------------------------
def _on_run_started(state: RunState, ev: RunStarted, now_ms: int, res: Result, compiled: CompiledPolicy, at: int) -> None:
    started = state.started_ts
    if started is not None and ev.ts < started:  # a late run_started stamped before the first step
        state.started_ts = ev.ts
    if state.policy is None:
        # A late run_started sets the policy from then on; it is never inferred.
        policy = state.policy = intern_policy(ev.policy)
        state.agent = ev.agent
        job_id = ev.job_id
        if job_id is not UNSET or ev.attempt is not UNSET or ev.recovers is not UNSET:
            state.recovery = Recovery(
                job_id=state.run_id if job_id is UNSET else job_id,
                attempt=1 if ev.attempt is UNSET else ev.attempt,
                recovers=None if ev.recovers is UNSET else ev.recovers,
            )
    else:
        _ignore(state, res, "duplicate_run_started")
    _activity(state, res, ev.ts, now_ms, at)


def _gap_at(gaps: list[tuple[int, int]], step: int) -> int:
    """Index of the gap holding ``step``, or -1 (gaps are sorted and disjoint: O(log gaps))."""
    i = bisect_right(gaps, step, key=_lo) - 1
    return i if i >= 0 and step <= gaps[i][1] else -1


def _seen(seg: Segment, step: int) -> bool:
    if step > seg.max_step:
        return False
    return _gap_at(seg.gaps, step) < 0


def _fill_gap(seg: Segment, step: int) -> None:
    i = _gap_at(seg.gaps, step)
    if i >= 0:
        lo, hi = seg.gaps[i]
        seg.gaps[i : i + 1] = [(a, b) for a, b in ((lo, step - 1), (step + 1, hi)) if a <= b]


def _add_gap(seg: Segment, lo: int, hi: int) -> None:
    gaps = seg.gaps
    gaps.append((lo, hi))
    if len(gaps) > MAX_GAPS:  # forget the lowest: from then on their steps are untracked, not new
        seg.forgot_hi = max(seg.forgot_hi, gaps[-MAX_GAPS - 1][1])
        del gaps[:-MAX_GAPS]


def _on_step(state: RunState, ev: StepFinished, now_ms: int, res: Result, compiled: CompiledPolicy, at: int) -> None:
    ts = ev.ts
    last = state.last_activity_ts  # _activity, inline: with Usage.tokens' below, ~2.5 % of apply (docs/architecture.md)
    if last is None or at > last:
        state.last_activity_ts = at
    if at > state.last_seen_ts:
        state.last_seen_ts = at
    if state.health is None:
        _start(state, res, ts, now_ms)
    segment = ev.segment
    seg = state.open.get(segment)
    if seg is None:  # an open segment is never also ended: the ended list is read only here
        if segment in state.ended:
            _ignore(state, res, "step_after_end")
            return
        seg = state.open[segment] = Segment()
        if segment > state.current:
            state.current = segment
    if seg.policy is not None:  # segment_started gave this segment a policy of its own
        compiled = compile_policy(seg.policy)
    step = ev.step
    max_step = seg.max_step
    if step <= max_step:
        if step <= seg.forgot_hi:
            _ignore(state, res, "untracked_step")
            return
        if _seen(seg, step):
            _ignore(state, res, "duplicate_step")
            return

    if step > max_step + 1:
        seg.step_gap = True
        _add_gap(seg, max_step + 1, step - 1)
    elif step <= max_step:
        _fill_gap(seg, step)
    seg.steps_seen += 1
    usage = ev.usage
    total = usage.total_tokens  # Usage.tokens, inline (see _activity's above)
    seg.tokens += total if total is not None else (usage.input_tokens or 0) + (usage.output_tokens or 0)

    fired: tuple[str, ...] = ()
    calls = ev.tool_calls
    if calls:
        if len(calls) == 1 and not calls[0].provider_executed:  # the common case: one call, no loop
            status = calls[0].status
            statuses: tuple[str, ...] = (status,)
            errors = 1 if status == "error" else 0
            settled = status in SETTLED_STATUSES
        else:
            statuses, settled = loop_statuses(calls)
            errors = statuses.count("error")
        if errors:
            seg.tool_errors += errors
            state.tool_errors += errors
            if state.recovery is not None or (state.policy is not None and state.policy.recovery is not UNSET):
                _name_failed(_recovery(state), calls)
        if settled and ev.finish_reason != "interrupted":  # is_evaluated(ev)
            # the SDK's steps.length at this step is step + 1
            fired = compiled.evaluate(step + 1, seg.tokens, calls)
            if fired and (seg.stop_step is None or step < seg.stop_step):
                seg.stop_step = step
        if step > max_step:
            seg.max_step = step
            seg.finish_reason = ev.finish_reason
            seg.statuses = statuses
            seg.fired = fired
    elif step > max_step:
        seg.max_step = step
        seg.finish_reason = ev.finish_reason
        seg.statuses = ()
        seg.fired = fired

    if state.health != "RUNNING":
        # A step after STUCK or after any verdict means the run is moving again.
        _move(state, res, "RUNNING", "progress", ts, now_ms)


def _name_failed(rec: Recovery, calls) -> None:
    """Remember the names of a step's failed tool calls, for FAILED's idempotence rule (at most MAX_FAILED_TOOLS)."""
    names = rec.failed_tools
    for call in calls:
        if call.status == "error" and not call.provider_executed:
            name = call.name
            if name in names:
                rec.named_errors += 1
            elif len(names) < MAX_FAILED_TOOLS:
                names.append(name)
                rec.named_errors += 1


def _disagreements(state: RunState, ev: RunEnded, seg: Segment, derived: str, derived_fired: tuple[str, ...]) -> tuple[str, ...]:
    found = []
    if ev.cause not in UNCHECKED_CAUSES and ev.cause != derived:
        found.append("cause_mismatch")
    for cid in ev.fired:  # a reported id the steps do not bear out
        if cid not in derived_fired:
            found.append("fired_mismatch")
            break
    if ev.step_count != seg.steps_seen:
        found.append("step_count_mismatch")
    if seg.stop_step is not None and seg.max_step > seg.stop_step:
        found.append("policy_overrun")
    if ev.cause == "stop_condition" and state.policy is None:
        found.append("policy_unknown")
    if seg.step_gap:
        found.append("step_gap")
    if ev.cause == "unknown":
        found.append("cause_not_recorded")
    if ev.cause == "tool_error" and seg.tool_errors == 0:
        found.append("tool_error_unseen")
    if state.dropped:
        found.append("producer_dropped")
    return tuple(sorted(found)) if found else ()


def _on_run_ended(state: RunState, ev: RunEnded, now_ms: int, res: Result, compiled: CompiledPolicy, at: int) -> None:
    _activity(state, res, ev.ts, now_ms, at)
    if ev.segment in state.ended:
        _ignore(state, res, "duplicate_run_ended")
        return
    seg = state.open.pop(ev.segment, None) or Segment()
    if seg.policy is not None:  # segment_started gave this segment a policy of its own
        compiled = compile_policy(seg.policy)
    state.ended.append(ev.segment)
    if ev.segment > state.current:
        state.current = ev.segment

    fired_at_last = seg.fired
    if ev.steered and seg.steps_seen and not seg.statuses:
        # The SDK evaluated stopWhen after this last step without tool calls (a steering message
        # was waiting), which _on_step does not do on its own: evaluate the policy at it now.
        fired_at_last = compiled.evaluate(seg.max_step + 1, seg.tokens, ())
    derived, derived_fired = derive_cause(
        seg.steps_seen, seg.statuses, seg.finish_reason, fired_at_last, ev.fired, compiled.conditions,
        compiled.custom_ids, ev.steered,
    )
    disagreements = _disagreements(state, ev, seg, derived, derived_fired)
    res.notes.append(("cause", derived))
    res.notes.append(("reported_cause", ev.cause))
    if disagreements:
        res.notes.extend([("disagreement", d) for d in disagreements])

    state.reported_cause = ev.cause
    state.derived_cause = derived
    state.fired = derived_fired
    state.disagreements = disagreements
    state.ended_step_count = seg.steps_seen
    state.ended_finish_reason = seg.finish_reason
    state.verify_deadline_ts = None
    if ev.cause == "approval_required":
        state.approval = ev.approval
        state.approval_pending = True
    else:
        state.approval_pending = False

    to, reason = _DROPPED_VERDICT if state.dropped else verdict(
        Facts(
            cause=ev.cause,
            derived_cause=derived,
            fired=derived_fired,
            roles=compiled.roles,
            disagreements=disagreements,
            last_tool_error="error" in seg.statuses,
            approval=ev.approval,
            receipt_state=_receipts_verdict(state),
        )
    )
    if to == "VERIFYING":
        state.verify_deadline_ts = at + compiled.window_ms
    _move(state, res, to, reason, ev.ts, now_ms)


def _pending_approval(state: RunState, ev: ApprovalRouted | ApprovalResolved, res: Result) -> Approval | None:
    """The run's pending approval if ``ev`` names it; otherwise the event is ignored and counted."""
    approval = state.approval
    if not state.approval_pending or approval is None or approval.approval_id != ev.approval_id:
        _ignore(state, res, "unmatched_approval")
        return None
    return approval


def _on_approval_routed(state: RunState, ev: ApprovalRouted, now_ms: int, res: Result, compiled: CompiledPolicy, at: int) -> None:
    _activity(state, res, ev.ts, now_ms, at)
    approval = _pending_approval(state, ev, res)
    if approval is None:
        return
    state.approval = Approval(
        approval_id=approval.approval_id,
        tool_call_id=approval.tool_call_id,
        tool_name=approval.tool_name,
        owner=ev.owner if ev.owner is not None else approval.owner,
        deadline_ts=ev.deadline_ts if ev.deadline_ts is not None else approval.deadline_ts,
        resume_token=ev.resume_token if ev.resume_token is not None else approval.resume_token,
    )
    if state.health == "WAITING_UNROUTED" and state.approval.routed:
        _move(state, res, "WAITING", "approval_routed", ev.ts, now_ms)


def _on_approval_resolved(state: RunState, ev: ApprovalResolved, now_ms: int, res: Result, compiled: CompiledPolicy, at: int) -> None:
    _activity(state, res, ev.ts, now_ms, at)
    if _pending_approval(state, ev, res) is None:
        return
    # Approved or denied, the run resumes in the next segment.
    state.approval_pending = False
    _move(state, res, "RUNNING", "approval_resolved", ev.ts, now_ms)


def _on_receipt(state: RunState, ev: OutcomeReceipt, now_ms: int, res: Result, compiled: CompiledPolicy, at: int) -> None:
    state.last_seen_ts = max(state.last_seen_ts, at)  # not activity: receipts never start a run
    if ev.receipt_id in state.receipt_ids:
        _ignore(state, res, "duplicate_receipt")
        res.notes.append(("receipt", "duplicate"))
        return
    started = state.started_ts
    if started is not None and _stamp(ev) < started:  # an earlier occurrence's receipt
        _refuse_stale(state, res, ev.receipt_id)
        return
    tracked = len(state.receipt_ids) < MAX_RECEIPT_IDS
    if tracked:
        state.receipt_ids.append(ev.receipt_id)
        if state.health is None:  # its occurrence is known at the start (_start)
            state.held.append((ev.receipt_id, ev.kind, ev.verified, _stamp(ev)))
    kinds = state.verified_kinds if ev.verified else state.negative_kinds
    if ev.kind not in kinds:
        kinds.append(ev.kind)

    late = state.health == FALSE_COMPLETE or (
        state.verify_deadline_ts is not None and at > state.verify_deadline_ts
    )
    if not tracked:
        label = "untracked"  # past MAX_RECEIPT_IDS ids: maybe a repeat of one not kept, so never counted as new
    elif not ev.verified:
        label = "negative"
    elif state.health is None:
        label = "held"
    else:
        label = "late" if late else "on_time"
    res.notes.append(("receipt", label))

    found = _receipts_verdict(state)
    if state.health == "VERIFYING" and found is not None:
        _move(state, res, found, "receipt" if found == VERIFIED_COMPLETE else "negative_receipt", ev.ts, now_ms)
    elif state.health == FALSE_COMPLETE and found == VERIFIED_COMPLETE:
        _move(state, res, VERIFIED_COMPLETE, "late_receipt", ev.ts, now_ms)
    # After any other verdict (or before one) the receipt is kept for evidence and the next verdict.


# The verdict of a run whose producer lost events: what the steps show is not what happened, so
# neither the agent (FAILED, STUCK) nor the destination (complete) is judged on it.
_DROPPED_VERDICT = ("UNCERTAIN", "producer_dropped")
# A run's states in which a loss report changes nothing at once: still running (the verdict comes
# at run_ended, or when the silence the loss caused times out), or already UNCERTAIN.
_DROP_WAITS = (None, "RUNNING", "UNCERTAIN")


def _on_segment_started(state: RunState, ev: SegmentStarted, now_ms: int, res: Result, compiled: CompiledPolicy, at: int) -> None:
    _activity(state, res, ev.ts, now_ms, at)
    segment = ev.segment
    seg = state.open.get(segment)
    if seg is None:
        if segment in state.ended:
            _ignore(state, res, "late_segment_started")
            return
        seg = state.open[segment] = Segment()
        if segment > state.current:
            state.current = segment
    elif seg.steps_seen:  # its steps were already evaluated under another policy
        _ignore(state, res, "late_segment_started")
        return
    seg.policy = None if ev.policy is None else intern_policy(ev.policy)


def _on_run_active(state: RunState, ev: RunActive, now_ms: int, res: Result, compiled: CompiledPolicy, at: int) -> None:
    # Activity and nothing else: a long tool or model call is not STUCK, and not progress either.
    _activity(state, res, ev.ts, now_ms, at)


def _on_events_dropped(state: RunState, ev: EventsDropped, now_ms: int, res: Result, compiled: CompiledPolicy, at: int) -> None:
    _activity(state, res, ev.ts, now_ms, at)
    state.dropped += ev.count
    if state.health == "UNCERTAIN" and "producer_dropped" not in state.disagreements:
        # No transition (already UNCERTAIN), but the evidence the read API shows names the loss.
        state.disagreements = tuple(sorted((*state.disagreements, "producer_dropped")))
    elif state.health not in _DROP_WAITS:
        # A verdict (or STUCK) taken on what the loss left: it no longer stands.
        disagreements = state.disagreements
        if "producer_dropped" not in disagreements:
            state.disagreements = tuple(sorted((*disagreements, "producer_dropped")))
        _move(state, res, *_DROPPED_VERDICT, ev.ts, now_ms)
def _on_untrusted_receipt(state: RunState, ev: UntrustedReceipt, now_ms: int, res: Result, compiled: CompiledPolicy, at: int) -> None:
    # Kept in evidence and counted; it neither decides a verdict nor blocks a trusted receipt of the same id.
    state.last_seen_ts = max(state.last_seen_ts, at)  # not activity, like any receipt
    res.notes.append(("receipt", "untrusted_" + ev.why))
    ids = state.untrusted_receipt_ids
    if ev.receipt.receipt_id not in ids and len(ids) < MAX_RECEIPT_IDS:
        ids.append(ev.receipt.receipt_id)


def _on_trusted_receipt(state: RunState, ev: TrustedReceipt, now_ms: int, res: Result, compiled: CompiledPolicy, at: int) -> None:
    # A receipt as any other, and the evidence of how it was trusted (before a transition it makes carries it).
    receipt = ev.receipt
    rid = receipt.receipt_id
    started = state.started_ts
    if rid not in state.receipt_ids and len(state.receipt_ids) < MAX_RECEIPT_IDS and (
        started is None or _stamp(receipt) >= started  # a stale one is refused by _on_receipt
    ):
        state.receipt_trust[rid] = ev.by
    _on_receipt(state, receipt, now_ms, res, compiled, at)


def _on_expected(state: RunState, ev: OutcomeExpected, now_ms: int, res: Result, compiled: CompiledPolicy, at: int) -> None:
    # Evidence only: an expectation is for the verifier; it is not activity and never starts a run.
    state.last_seen_ts = max(state.last_seen_ts, at)
    ids = state.expectation_ids
    if ev.expectation_id in ids:
        _ignore(state, res, "duplicate_expectation")
    elif len(ids) < MAX_RECEIPT_IDS:
        ids.append(ev.expectation_id)


# -- a person's action (docs/contract.md section 12, docs/recovery.md) --------------
def _refuse_action(state: RunState, res: Result, why: str) -> None:
    """An operator action that changes nothing: counted in the run's evidence and in the notes."""
    _ignore(state, res, "refused_operator_action")
    res.notes.append(("operator_action", why))


def _on_unclassified_action(state: RunState, ev: OperatorAction, now_ms: int, res: Result, compiled: CompiledPolicy, at: int) -> None:
    # No shell vouched for it (no trusted keys configured): a person's action is trusted only by a key.
    _refuse_action(state, res, "unsigned" if ev.signature is UNSET else "unknown_key")


def _on_untrusted_action(state: RunState, ev: UntrustedAction, now_ms: int, res: Result, compiled: CompiledPolicy, at: int) -> None:
    _refuse_action(state, res, ev.why)


def _on_trusted_action(state: RunState, ev: TrustedAction, now_ms: int, res: Result, compiled: CompiledPolicy, at: int) -> None:
    act = ev.action
    started = state.started_ts
    stamp = act.ts if act.run_started_ts is UNSET else act.run_started_ts
    if started is None or stamp < started:  # an earlier occurrence's run (or one not started): not this one
        _refuse_action(state, res, "stale")
        return
    rec = _recovery(state)
    requests = rec.requests
    if act.request_id in requests:  # a double click, a re-sent command
        _refuse_action(state, res, "repeated")
        return
    requests.append(act.request_id)
    if len(requests) > MAX_REQUESTS:
        del requests[:-MAX_REQUESTS]
    kind = act.action
    if rec.closed_by is not None and kind != "acknowledge":
        _refuse_action(state, res, "closed")
        return
    policy = state.policy
    recovery = None if policy is None or policy.recovery is UNSET else policy.recovery
    max_attempts = 1 if recovery is None else recovery.max_attempts  # type: ignore[union-attr]
    attempt = rec.attempt
    beyond = attempt >= max_attempts
    next_attempt = None
    if kind == "retry":
        if beyond and not act.override_bound:
            _refuse_action(state, res, "attempts_exhausted")
            return
        action, next_attempt = "restart", attempt + 1
        rec.acted = True  # no automatic action after a person's retry of this attempt
    elif kind == "abandon":
        action = kind
        rec.closed_by = ev.by
    elif kind == "acknowledge":
        action = kind
        rec.acknowledged_by = ev.by
    else:  # reverify, escalate
        action = kind
    res.notes.append(("operator_action", "applied"))
    res.actions.append(RecoveryAction(
        action_id=f"{state.run_id}:op:{act.request_id}",
        run_id=state.run_id,
        agent=state.agent,
        job_id=rec.job_id or state.run_id,
        attempt=attempt,
        next_attempt=next_attempt,
        action=action,  # type: ignore[arg-type]
        reason=act.reason,
        ts=act.ts,
        not_before_ts=act.ts,
        next_policy=recovery.next_policy if recovery is not None and next_attempt is not None else None,  # type: ignore[union-attr]
        escalate_to=None if recovery is None else recovery.escalate_to,  # type: ignore[union-attr]
        decided_by=ev.by,
        override_bound=next_attempt is not None and beyond,
    ))


# Each handler gets the compiled policy in force when the event arrived (run_started, which
# may set the policy, does not use it).
_HANDLERS = {
    RunStarted: _on_run_started,
    StepFinished: _on_step,
    RunEnded: _on_run_ended,
    ApprovalRouted: _on_approval_routed,
    ApprovalResolved: _on_approval_resolved,
    OutcomeReceipt: _on_receipt,
    SegmentStarted: _on_segment_started,
    RunActive: _on_run_active,
    EventsDropped: _on_events_dropped,
    UntrustedReceipt: _on_untrusted_receipt,
    TrustedReceipt: _on_trusted_receipt,
    OutcomeExpected: _on_expected,
    OperatorAction: _on_unclassified_action,
    UntrustedAction: _on_untrusted_action,
    TrustedAction: _on_trusted_action,
}


def apply(state: RunState | None, event: InputEvent | UntrustedReceipt | TrustedReceipt, now_ms: int, clock_ms: int | None = None) -> Result:
    """Fold one event into its run's state: :func:`apply_into` a new :class:`Result`, returned."""
    res = Result(None)
    res.state = apply_into(res, state, event, now_ms, clock_ms)
    return res


def apply_into(res: Result, state: RunState | None, event: InputEvent | UntrustedReceipt | TrustedReceipt, now_ms: int,
               clock_ms: int | None = None) -> RunState:
    """Fold one event into its run's state; the run's state is returned (``res.state`` is not touched).

    Transitions and notes are appended to ``res``'s lists, which the caller owns: a shell keeps
    one ``Result`` for every event it applies, takes out what each left there (a fresh list in
    place of a non-empty one it hands on, ``clear()`` for the rest) and saves a ``Result`` and two
    lists per event (2.3 % of ``Replay.feed``'s instructions, bench/HISTORY.md "a core").
    :func:`apply` is this on a new ``Result``.

    An event counts from when it could be known (docs/contract.md section 5, "Over time"):
    its run's activity and last-seen times, and the receipt window it opens, are placed at
    ``at = max(event.ts, clock_ms)`` — loopwarden cannot have known of an event before it
    arrived, so an event older than the clock by more than a timeout opens a fresh window
    instead of timing its run out at once. Timers of the event's own run that were due by
    ``at`` fire first (a receipt stamped after the receipt window is late however soon it
    is processed), so a run's transitions do not depend on how promptly the shell ticks.
    Retention never fires here: an event keeps its run alive. A transition an event makes
    carries the event's own ``ts``.

    Parameters
    ----------
    state
        The run's state, or None for a run not seen yet (a new state is made).
    event
        A decoded, valid input event of this run.
    now_ms
        The shell's clock (event time in replay, processing time in the processor):
        the ``emitted_ts`` of any transition.
    clock_ms
        The shell's event-time clock when the event is applied (the latest ``ts`` it has
        applied, this event's included: the same in replay and the worker, in either
        clock mode). None: the event is placed at its own ``ts`` (a caller with no clock).
    """
    ts = event.ts
    at = ts if clock_ms is None or clock_ms <= ts else clock_ms
    if state is None:
        state = RunState(event.run_id)
    elif state.tomb:  # the run id comes back after retention dropped it: its seq goes on
        state = RunState(run_id=event.run_id, seq=state.seq)
    policy = state.policy
    compiled = _BY_ID.get(id(policy)) or compile_policy(policy)
    health = state.health
    # _run_deadline for RUNNING, inline: without it apply takes ~5 % longer (docs/architecture.md)
    if health == "RUNNING":  # the common case: is the inactivity timer due by the event's placement?
        last = state.last_activity_ts
        if last is not None:
            deadline = last + compiled.inactivity_ms
            if deadline <= at:
                _fire(state, deadline, "no_progress", now_ms, res)  # to STUCK: no timer of its own
    elif health in _RUN_TIMER_KINDS:
        while True:
            deadline = _run_deadline(state)
            if deadline is None or deadline > at:
                break
            _fire(state, deadline, _RUN_TIMER_KINDS[state.health], now_ms, res)
    _HANDLERS[type(event)](state, event, now_ms, res, compiled, at)  # type: ignore[operator]
    return state


# Event types after which a run's next deadline is never earlier than before, unless the event
# made a transition or a new state (a new run, or one back from its tomb): a step or a receipt
# only moves last_activity_ts / last_seen_ts forward, and any change of health is a transition.
# (run_started may set a shorter inactivity timeout, approval_routed an earlier deadline.) A
# shell need not look at the run's queued timer after them; tests/unit/test_core_fast_paths.py
# checks the claim on every such event of its fleets.
DEADLINE_KEEPING = frozenset({StepFinished, OutcomeReceipt, UntrustedReceipt, TrustedReceipt, OutcomeExpected})

# -- timers -------------------------------------------------------------------
_RUN_TIMER_KINDS = STATE_TIMERS  # RUNNING: no_progress, WAITING: approval_expired, VERIFYING: receipt_window_expired
# The reasons of transitions a timer fired (their ``ts`` is the deadline, not an event's).
TIMER_REASONS = frozenset(_RUN_TIMER_KINDS.values())
_TIMERLESS = frozenset(TIMERLESS)
_RETENTION_MS: dict[float, int] = {}


def _run_deadline(state: RunState) -> int | None:
    """The deadline (ms) of the run's own timer (kind: ``_RUN_TIMER_KINDS[state.health]``), if any.

    A run has at most one timer: its health's (no_progress, approval_expired,
    receipt_window_expired) or, in a state with none of those, retention.
    """
    health = state.health
    if health == "RUNNING":
        last = state.last_activity_ts
        if last is None:
            return None
        return last + compile_policy(state.policy).inactivity_ms
    if health == "WAITING":
        approval = state.approval
        return None if approval is None else approval.deadline_ts
    if health == "VERIFYING":
        return state.verify_deadline_ts
    return None


def _ms_of(seconds: float) -> int:
    ms = _RETENTION_MS.get(seconds)
    if ms is None:
        if len(_RETENTION_MS) > 64:
            _RETENTION_MS.clear()
        ms = _RETENTION_MS[seconds] = _ms(seconds)
    return ms


def _timer(state: RunState, settings: Settings) -> tuple[int, str] | None:
    """The run's timer, ``(deadline ms, kind)``, or None when it has none."""
    deadline = next_deadline(state, settings)
    if deadline is None:
        return None
    health = state.health
    if health in _TIMERLESS:
        return deadline, "forget" if state.tomb else "retention"
    return deadline, _RUN_TIMER_KINDS[health]


def next_deadline(state: RunState, settings: Settings = DEFAULT_SETTINGS) -> int | None:
    """The earliest deadline (ms) of the run's timers, or None when it has none."""
    if state.health in _TIMERLESS:
        if state.tomb:
            return state.last_seen_ts + _ms_of(settings.seq_memory_s)
        return state.last_seen_ts + _ms_of(settings.retention_s)
    return _run_deadline(state)


def fire_next(state: RunState, now_ms: int, settings: Settings = DEFAULT_SETTINGS) -> Result:
    """Fire the run's earliest timer if it is due (deadline <= ``now_ms``).

    The transition's ``ts`` is the deadline. A run dropped after retention comes
    back as its tomb (``Result(state=<tomb>)``: run id and seq), or as
    ``Result(state=None)`` when it never emitted a transition, with orphaned receipts
    counted in the notes; a tomb comes back as None once ``seq_memory_s`` passed.
    """
    res = Result(state=state)
    timer = _timer(state, settings)
    if timer is None:
        return res
    deadline, kind = timer
    if deadline > now_ms:
        return res
    if kind == "forget":
        res.state = None
    elif kind == "retention":
        res.state = RunState(run_id=state.run_id, seq=state.seq, last_seen_ts=deadline, tomb=True) if state.seq else None
        if state.health is None:
            res.notes.extend(("receipt", "orphan") for _ in state.receipt_ids)
        res.notes.append(("evicted", state.health or "NEVER_STARTED"))
    else:
        _fire(state, deadline, kind, now_ms, res)
    return res


def _fire(state: RunState, deadline: int, kind: str, now_ms: int, res: Result) -> None:
    res.notes.append(("timer", kind))
    if state.dropped and kind == "no_progress":
        # The silence may be the loss itself (its run_ended among the lost events): not the agent's.
        disagreements = state.disagreements
        if "producer_dropped" not in disagreements:
            state.disagreements = tuple(sorted((*disagreements, "producer_dropped")))
        _move(state, res, *_DROPPED_VERDICT, deadline, now_ms)
        return
    to = FALSE_COMPLETE if kind == "receipt_window_expired" else "STUCK"  # no_progress, approval_expired
    _move(state, res, to, kind, deadline, now_ms)
