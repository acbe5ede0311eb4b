"""Wire types of docs/contract.md sections 3, 6, 10 and 11, as frozen msgspec Structs.

Every constraint of the contract lives here, either as a ``Meta`` on a reusable
alias or as a cross-field check in ``__post_init__``, so a value that decodes is
a value the rules core can trust.
"""

from __future__ import annotations

from typing import Annotated, Literal, Union

from msgspec import UNSET, Meta, Struct, UnsetType, field

from loopwarden.codecs.states import STATE_NAMES

# -- reusable limits ---------------------------------------------------------
# ts fits in a JavaScript number exactly, so TypeScript producers and consumers agree.
MAX_SAFE_INT = 2**53 - 1

RunId = Annotated[str, Meta(min_length=1, max_length=200)]
AgentName = Annotated[str, Meta(min_length=1, max_length=100)]
# Ids and names the spec leaves unbounded get a generous bound, so that one
# producer cannot make per-run state (or a dead-letter log line) arbitrarily big.
Ident = Annotated[str, Meta(min_length=1, max_length=200)]
Name = Annotated[str, Meta(min_length=1, max_length=200)]
ShortText = Annotated[str, Meta(max_length=200)]
TsMs = Annotated[int, Meta(ge=0, le=MAX_SAFE_INT)]
Count = Annotated[int, Meta(ge=0, le=MAX_SAFE_INT)]
Tokens = Annotated[int, Meta(ge=0, le=MAX_SAFE_INT)]
# A year is far beyond any sane timeout; the bound keeps deadlines inside int range.
DurationS = Annotated[float, Meta(gt=0, le=366 * 86400)]
EvidenceValue = Union[
    Annotated[str, Meta(max_length=1000)], bool, int, float
]

FinishReason = Literal[
    "stop", "length", "content-filter", "tool-calls", "error", "interrupted", "other"
]
ToolStatus = Literal["result", "error", "pending", "approval_requested", "denied", "cancelled"]
Cause = Literal[
    "natural_finish",
    "stop_condition",
    "unexecuted_tool",
    "approval_required",
    "tool_error",
    "aborted",
    "timeout",
    "error",
    "unknown",
]
ReceiptKind = Literal["file", "record", "message", "deployment", "analysis", "other"]
Verifier = Literal["destination", "validator", "human"]
Role = Literal["bound", "completion"]
# The health states are rows of loopwarden.codecs.states (their stored numbers, timers, meaning, colours).
State = Literal[STATE_NAMES]  # type: ignore[valid-type]

STATES: tuple[str, ...] = STATE_NAMES
CAUSES: tuple[str, ...] = Cause.__args__  # type: ignore[attr-defined]
FINISH_REASONS: tuple[str, ...] = FinishReason.__args__  # type: ignore[attr-defined]
TOOL_STATUSES: tuple[str, ...] = ToolStatus.__args__  # type: ignore[attr-defined]
RECEIPT_KINDS: tuple[str, ...] = ReceiptKind.__args__  # type: ignore[attr-defined]


# -- stop conditions (tagged by `kind`) ---------------------------------------
class _Condition(Struct, frozen=True, gc=False, tag_field="kind"):
    pass


class StepCount(_Condition, tag="step_count"):
    """``isStepCount(count)``: fires when the segment has exactly ``count`` steps."""

    count: Count

    @property
    def ids(self) -> tuple[str, ...]:
        return (f"step_count:{self.count}",)


class ToolCallCondition(_Condition, tag="tool_call"):
    """``hasToolCall(...tools)``: fires when the last step calls one of ``tools``."""

    tools: Annotated[tuple[Name, ...], Meta(min_length=1, max_length=100)]

    @property
    def ids(self) -> tuple[str, ...]:
        return tuple(f"tool_call:{t}" for t in self.tools)


class LoopFinished(_Condition, tag="loop_finished"):
    """``isLoopFinished()``: never fires (it removes the default step cap)."""

    @property
    def ids(self) -> tuple[str, ...]:
        return ("loop_finished",)


class TokenBudget(_Condition, tag="token_budget"):
    """Fires when the segment's summed tokens reach ``max_tokens``."""

    max_tokens: Annotated[int, Meta(gt=0, le=MAX_SAFE_INT)]

    @property
    def ids(self) -> tuple[str, ...]:
        return (f"token_budget:{self.max_tokens}",)


class Custom(_Condition, tag="custom"):
    """An opaque condition: loopwarden only learns it fired from ``run_ended.fired``."""

    name: Name
    role: Role

    @property
    def ids(self) -> tuple[str, ...]:
        return (f"custom:{self.name}",)


Condition = Union[StepCount, ToolCallCondition, LoopFinished, TokenBudget, Custom]


# -- bounded recovery (docs/contract.md section 12, docs/recovery.md) -----------
# What a policy may call for. A person's abandon and acknowledge are published too, as records
# (a fleet's controller drops a job's pending retry on abandon): ActionName is every action on agent.actions.
RecoveryActionName = Literal["resume", "restart", "reverify", "escalate"]
RECOVERY_ACTIONS: tuple[str, ...] = RecoveryActionName.__args__  # type: ignore[attr-defined]
ActionName = Literal["resume", "restart", "reverify", "escalate", "abandon", "acknowledge"]
# Which states each action can answer: resume continues a run that stalled; restart begins a new attempt of
# a run that stopped without the work done; reverify asks the verifiers again; escalate fits any state.
ACTION_STATES: dict[str, frozenset[str]] = {
    "resume": frozenset({"STUCK"}),
    "restart": frozenset({"STUCK", "BOUNDED_STOP", "FALSE_COMPLETE", "FAILED"}),
    "reverify": frozenset({"FALSE_COMPLETE"}),
    "escalate": frozenset({"WAITING", "WAITING_UNROUTED", "STUCK", "BOUNDED_STOP", "FAILED", "FALSE_COMPLETE",
                           "UNCERTAIN"}),
}
Attempt = Annotated[int, Meta(ge=1, le=10_000)]


class RecoveryPolicy(Struct, frozen=True, gc=False, forbid_unknown_fields=True):
    """What a job may do on its own when an attempt ends in a state (declared, never inferred).

    Unknown fields are refused: a misspelt ``max_attempt`` must not leave a job unbounded by default.
    """

    max_attempts: Attempt = 1
    on: Annotated[dict[State, RecoveryActionName], Meta(max_length=16)] = {}
    backoff_s: Annotated[float, Meta(ge=0, le=366 * 86400)] = 0.0
    next_policy: Policy | None = None  # the next attempt's stop policy; None: the same
    idempotent_tools: Annotated[tuple[Name, ...], Meta(max_length=1000)] = ()
    escalate_to: Name | None = None

    def __hash__(self) -> int:
        # A policy is a key of the rules' memo of compiled policies (loopwarden.rules.conditions) and of the state
        # codec's, hashed at each run's start and each store write, where every decoded state holds a policy
        # object of its own. So the hash reads the scalar fields only (``on`` is a dict, and sorting it per call
        # cost ~5 % of a fold with a policy on every run); equal policies still hash alike, and equality decides.
        return hash((self.max_attempts, self.backoff_s, self.escalate_to, len(self.on), len(self.idempotent_tools)))

    def __post_init__(self) -> None:
        for state, action in self.on.items():
            if state not in ACTION_STATES[action]:
                allowed = ", ".join(sorted(ACTION_STATES[action]))
                raise ValueError(f"`on.{state}`: {action!r} cannot answer {state} (it answers {allowed})")


class Policy(Struct, frozen=True, gc=False):
    """The stop policy a run was started with (docs/contract.md section 3)."""

    version: ShortText
    stop_when: Annotated[tuple[Condition, ...], Meta(max_length=100)] | None = None
    inactivity_timeout_s: DurationS = 300.0
    receipt_window_s: DurationS = 600.0
    required_outcomes: Annotated[tuple[ReceiptKind, ...], Meta(max_length=6)] = ()
    # What the job may do on its own after this attempt (section 12). UNSET (absent on the wire): the agent's
    # default policy from the processor's configuration, else none.
    recovery: RecoveryPolicy | UnsetType = UNSET


DEFAULT_POLICY_CONDITIONS: tuple[Condition, ...] = (StepCount(count=20),)


# -- nested records -----------------------------------------------------------
class ToolCall(Struct, frozen=True, gc=False):
    id: Ident
    name: Name
    status: ToolStatus
    # The provider ran it (e.g. a provider's web search): the SDK still counts it in hasToolCall.
    # False (the default) for producers that report client-executed calls only.
    provider_executed: bool = False


class Usage(Struct, frozen=True, gc=False):
    input_tokens: Tokens | None = None
    output_tokens: Tokens | None = None
    total_tokens: Tokens | None = None

    @property
    def tokens(self) -> int:
        """Tokens this step counts towards a budget (total, else input + output)."""
        if self.total_tokens is not None:
            return self.total_tokens
        return (self.input_tokens or 0) + (self.output_tokens or 0)


class Approval(Struct, frozen=True, gc=False):
    approval_id: Ident
    tool_call_id: Ident
    tool_name: Name
    owner: Name | None = None
    deadline_ts: TsMs | None = None
    resume_token: Annotated[str, Meta(min_length=1, max_length=1000)] | None = None

    @property
    def routed(self) -> bool:
        return (
            self.owner is not None
            and self.deadline_ts is not None
            and self.resume_token is not None
        )


# -- input events on agent.steps / agent.outcomes (tagged by `type`) -----------
class _Event(Struct, frozen=True, gc=False, tag_field="type"):
    run_id: RunId
    ts: TsMs


class RunStarted(_Event, tag="run_started"):
    agent: AgentName
    policy: Policy
    # The job this run is an attempt of (section 12). Absent on the wire (UNSET): the run is its own job's
    # first attempt (job_id = run_id, attempt 1, recovers nothing).
    job_id: RunId | UnsetType = UNSET
    attempt: Attempt | UnsetType = UNSET
    recovers: RunId | UnsetType = UNSET  # the run id of the attempt this one replaces


class StepFinished(_Event, tag="step_finished"):
    step: Count
    finish_reason: FinishReason
    segment: Count = 0
    tool_calls: Annotated[tuple[ToolCall, ...], Meta(max_length=1000)] = ()
    usage: Usage = field(default_factory=Usage)


class RunEnded(_Event, tag="run_ended"):
    cause: Cause
    step_count: Count
    # The spec gives these two no default: they are required, and may be null.
    approval: Approval | None
    error_name: ShortText | None
    segment: Count = 0
    fired: Annotated[tuple[Annotated[str, Meta(max_length=300)], ...], Meta(max_length=200)] = ()
    # Beyond the spec: the call ran with experimental steering and a steering message was waiting
    # when its last step ended, so the SDK evaluated stopWhen after that step although it had no
    # tool calls (ai >= 7.0.154). False (the default) for emitters that do not know.
    steered: bool = False

    def __post_init__(self) -> None:
        if self.cause == "approval_required" and self.approval is None:
            raise ValueError(
                "`approval` is required when cause is 'approval_required', got null"
            )


class ApprovalRouted(_Event, tag="approval_routed"):
    approval_id: Ident
    owner: Name | None
    deadline_ts: TsMs | None
    resume_token: Annotated[str, Meta(min_length=1, max_length=1000)] | None


class ApprovalResolved(_Event, tag="approval_resolved"):
    approval_id: Ident
    approved: bool


class Signature(Struct, frozen=True, gc=False):
    """Who vouches for a receipt (docs/contract.md section 10): an Ed25519 signature by a verifier's key.

    ``sig`` is the base64url (no padding) of the 64-byte signature over
    ``loopwarden.codecs.canonical.receipt_signing_bytes`` of the receipt.
    """

    key_id: Ident
    sig: Annotated[str, Meta(min_length=1, max_length=200)]


class OutcomeReceipt(_Event, tag="outcome_receipt"):
    receipt_id: Ident
    kind: ReceiptKind
    verifier: Verifier
    verified: bool
    evidence: Annotated[dict[Annotated[str, Meta(max_length=100)], EvidenceValue], Meta(max_length=64)] = {}
    # The ``ts`` of the ``run_started`` of the occurrence of the run this receipt answers (docs/contract.md
    # section 10, "One occurrence"): signed, so a receipt cannot be re-sent to a later run that reuses the
    # run id. UNSET (absent on the wire) when the verifier did not see it: the receipt's own ``ts`` stands in.
    run_started_ts: TsMs | UnsetType = UNSET
    # UNSET (absent on the wire) when not signed, so an unsigned receipt encodes without the key.
    signature: Signature | UnsetType = UNSET


# -- what producers must also tell (docs/contract.md section 11) --------------
class SegmentStarted(_Event, tag="segment_started"):
    """The stop policy of one segment, when it is not the run's (e.g. a resume without stopWhen)."""

    segment: Count
    # null: the segment runs under the run's policy
    policy: Policy | None


class RunActive(_Event, tag="run_active"):
    """A model call or tool of the run is still going: activity, nothing else."""

    segment: Count
    in_: Literal["model", "tool"] = field(name="in")
    tool_call_id: Ident | None = None


class EventsDropped(_Event, tag="events_dropped"):
    """The producer lost ``count`` events of this run (queue full, process exiting)."""

    count: Annotated[int, Meta(ge=1, le=MAX_SAFE_INT)]


# A check's value: a scalar, or named scalars (`row` key, `fields`, `header`, `json` pointers).
CheckValue = Union[
    EvidenceValue,
    Annotated[dict[Annotated[str, Meta(max_length=200)], EvidenceValue], Meta(max_length=64)],
]


class OutcomeExpected(_Event, tag="outcome_expected"):
    """What a run must produce (docs/contract.md section 10), declared by the application, checked by a verifier."""

    expectation_id: Ident
    kind: ReceiptKind
    target: Annotated[str, Meta(min_length=1, max_length=2000)]
    checks: Annotated[dict[Annotated[str, Meta(max_length=100)], CheckValue], Meta(max_length=64)] = {}


OperatorActionName = Literal["retry", "reverify", "escalate", "abandon", "acknowledge"]


class OperatorAction(_Event, tag="operator_action"):
    """A person's decision on a run, on ``agent.steps``, signed like a human receipt (section 12).

    Unsigned, or signed by a key that is not trusted, it changes nothing and is counted.
    """

    request_id: Ident  # a repeated request id is ignored (a double click, a re-sent command)
    action: OperatorActionName
    reason: Annotated[str, Meta(min_length=1, max_length=200)]
    override_bound: bool = False  # retry beyond the policy's max_attempts (recorded in the action)
    actor: Name | UnsetType = UNSET  # who, as the signer vouches (the board names its signed-in user)
    # As on a receipt: the run occurrence the person looked at, signed, so an old action cannot be re-sent
    # to a later run that reuses the id; UNSET: the action's own ts stands in.
    run_started_ts: TsMs | UnsetType = UNSET
    signature: Signature | UnsetType = UNSET


StepEvent = Union[
    RunStarted, StepFinished, RunEnded, ApprovalRouted, ApprovalResolved, SegmentStarted, RunActive, EventsDropped,
    OutcomeExpected, OperatorAction,
]
OutcomeEvent = OutcomeReceipt
InputEvent = Union[
    RunStarted, StepFinished, RunEnded, ApprovalRouted, ApprovalResolved, SegmentStarted, RunActive, EventsDropped,
    OutcomeExpected, OperatorAction, OutcomeReceipt,
]

STEP_EVENT_TYPES: tuple[type, ...] = (
    RunStarted, StepFinished, RunEnded, ApprovalRouted, ApprovalResolved, SegmentStarted, RunActive, EventsDropped,
    OutcomeExpected, OperatorAction,
)
INPUT_EVENT_TYPES: tuple[type, ...] = STEP_EVENT_TYPES + (OutcomeReceipt,)


# -- output on agent.health --------------------------------------------------
class Evidence(Struct, frozen=True, gc=False):
    """Content-free evidence attached to every transition (docs/contract.md section 6)."""

    reported_cause: str | None
    derived_cause: str | None
    fired: tuple[str, ...]
    step_count: int
    segments: int
    tool_errors: int
    finish_reason: str | None
    disagreements: tuple[str, ...]
    receipt_ids: tuple[str, ...]
    approval: Approval | None
    # Beyond the spec's list: events that were ignored and counted (duplicates,
    # steps after their segment ended, approvals for another id), by kind.
    ignored: dict[str, int] = {}
    # docs/contract.md section 11: events of the run its producer reported lost (events_dropped), summed.
    events_dropped: int = 0
    # docs/contract.md section 10, present only when non-empty (a transition without them encodes without the keys):
    # receipts kept but not counted (unsigned, unknown key, bad signature) and the run's expectations.
    untrusted_receipt_ids: tuple[str, ...] | UnsetType = UNSET
    expectation_ids: tuple[str, ...] | UnsetType = UNSET
    # How each counted receipt was trusted, present only when a trust setting decided it (docs/receipts.md):
    # receipt id -> `channel:<topic>` (came on the verifiers' own topic) or `key:<key_id>` (signed by it).
    receipt_trust: dict[str, str] | UnsetType = UNSET
    # Section 12, present only for a run that declared a job (job_id or attempt in its run_started):
    job_id: str | UnsetType = UNSET
    attempt: int | UnsetType = UNSET
    # The recovery action this transition caused, present only on that transition.
    action_id: str | UnsetType = UNSET


class HealthTransition(Struct, frozen=True, gc=False, tag_field="type", tag="health_transition"):
    run_id: str
    seq: Annotated[int, Meta(ge=1)]
    ts: int
    emitted_ts: int
    agent: str | None
    policy_version: str | None
    from_state: State | None
    to_state: State
    reason: str
    evidence: Evidence


class RecoveryAction(Struct, frozen=True, gc=False, tag_field="type", tag="recovery_action"):
    """One action on ``agent.actions`` (keyed by job_id): what the fleet should do, and when."""

    # `<run_id>:<seq>` of the transition that caused it, `<run_id>:op:<request_id>` for a person's:
    # consumers drop repeats by it.
    action_id: str
    run_id: str
    # The run's agent, so that a fleet's consumer picks out its own agent's actions. None only for a person's
    # action on a run whose run_started never arrived.
    agent: str | None
    job_id: str
    attempt: int
    next_attempt: int | None
    action: ActionName
    reason: str  # `<state>:<transition reason>`, a safety rule's, or the person's own words
    ts: int
    not_before_ts: int
    next_policy: Policy | None
    escalate_to: str | None
    decided_by: str  # `policy:<policy version>` or `person:<key id>` (`person:<key id>/<actor>` from the board)
    override_bound: bool = False  # a person restarted beyond max_attempts
