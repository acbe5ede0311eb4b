"""A compact byte form of :class:`RunState`, for the stream processor's store and changelog.

``encode_state`` / ``decode_state`` are exact inverses: ``decode_state(encode_state(s), s.run_id) == s``.
The format is one version byte, then MessagePack arrays (no field names):

* ``0x02`` (written now): the RunState's fields in declaration order **without the run id** (it is
  the store's and the changelog record's key: the caller passes it, ``decode_state(raw, run_id)``,
  and a format-2 state decoded without it is a ValueError, never a made-up id). Times are written
  relative to ``last_seen_ts``, the one absolute time (``last_activity_ts``, ``verify_deadline_ts``,
  the approval's ``deadline_ts``, each history entry's ts, ``started_ts`` and each held receipt's
  stamp as their difference to it: 1-5 bytes instead of 9). An id that holds the run id (receipt,
  untrusted receipt, held receipt and expectation ids; the approval's id, tool call id and resume
  token) is written ``[before, after]``: the id is ``before + run_id + after`` (its first occurrence;
  a run id shorter than 4 characters is not looked for). The policy is a ``0x01`` policy array, decoded by looking its bytes up (policies are few);
  a policy's recovery policy is one more element, an array too: its states as word numbers, its actions as
  their place in ``RECOVERY_ACTIONS``, its next policy a policy array (the wire's map form is still read).
  A word's number outside :data:`WORDS` is refused by the decoder. A state whose times are more than
  64 bits apart from ``last_seen_ts`` is written as ``0x01``. On the simulated fleet (2,000 runs,
  seed 3): median 110 bytes (``0x01``: 194).
* ``0x01`` (still read: states already in changelogs): the RunState's fields in declaration order,
  the run id first; segments likewise; the policy, the approval and the stop conditions as arrays (a
  condition's first element is its kind as a small int; a policy duration equal to
  the wire default as nil); known words (health
  states, causes, finish reasons, tool statuses, reasons, receipt kinds, counted
  kinds) as small ints from :data:`WORDS`, any other string as itself. Segments, policies and words
  are the same in ``0x02``.

A new format gets a new version byte; ``decode_state`` reads every version it
knows and rejects any other with a ValueError naming it. :data:`WORDS` may only
grow at its end (a word's number is part of the format).
"""

from __future__ import annotations

from typing import Annotated, Union

import msgspec
from msgspec import UNSET, Struct
from msgspec.structs import astuple

from loopwarden.codecs.events import (
    Approval,
    Custom,
    LoopFinished,
    RECOVERY_ACTIONS,
    Policy,
    RecoveryPolicy,
    StepCount,
    TokenBudget,
    ToolCallCondition,
)
from loopwarden.codecs.states import STATE_TABLE
from loopwarden.rules.conditions import intern_policy
from loopwarden.rules.machine import Recovery, RunState, Segment

VERSION = 2
V1 = 1  # still read: states already in changelogs
_PREFIX = bytes([VERSION])
_PREFIX_V1 = bytes([V1])

# Strings that recur in every state, stored as their number: WORDS[number] is the word. A number is part
# of the stored format: it never changes and is never reused. The health states are at the numbers their
# rows give (loopwarden.codecs.states: ``word``); every other word takes the next number free, in the order
# of _WORDS. So _WORDS only grows at its end, and a new state's row takes the next number (``len(WORDS)``).
# tests/unit/test_state_codec.py holds every number given so far (tests/vectors/state-v2-golden.json).
_WORDS: tuple[str, ...] = (
    # causes
    "natural_finish", "stop_condition", "unexecuted_tool", "approval_required", "tool_error", "aborted",
    "timeout", "error", "unknown",
    # finish reasons (a word listed twice keeps its first number)
    "stop", "length", "content-filter", "tool-calls", "error", "interrupted", "other",
    # tool statuses
    "result", "error", "pending", "approval_requested", "denied",
    # receipt kinds
    "file", "record", "message", "deployment", "analysis", "other",
    # transition reasons that are not already above
    "started", "progress", "approval_routed", "approval_resolved", "receipt", "negative_receipt",
    "late_receipt", "no_progress", "approval_expired", "receipt_window_expired", "unclassified",
    # ignored-event kinds and disagreements
    "duplicate_run_started", "step_after_end", "duplicate_step", "duplicate_run_ended",
    "unmatched_approval", "duplicate_receipt",
    "cause_mismatch", "fired_mismatch", "step_count_mismatch", "policy_overrun", "policy_unknown",
    "step_gap", "cause_not_recorded", "tool_error_unseen",
    # producers' words (docs/contract.md section 11)
    "cancelled", "late_segment_started", "producer_dropped",
    # further words of loopwarden.codecs.vocabulary (tests/unit/test_vocabulary.py: every one is here)
    "untracked_step", "duplicate_expectation", "stale_receipt", "refused_operator_action",
)


def _numbered(fixed: dict[int, str], rest: tuple[str, ...]) -> tuple[str, ...]:
    """The word table: ``fixed`` words at their numbers, ``rest`` in order at the numbers left free."""
    size = len(fixed) + len(rest)
    if any(not 0 <= n < size for n in fixed):
        raise ValueError(f"the states' word numbers {sorted(fixed)} leave a gap in the word table: "
                         f"a new state takes the next number, {size - 1}")
    others = iter(rest)
    return tuple(fixed[n] if n in fixed else next(others) for n in range(size))


WORDS: tuple[str, ...] = _numbered({s.word: s.name for s in STATE_TABLE}, _WORDS)
_INDEX: dict[str, int] = {}
for _i, _w in enumerate(WORDS):
    _INDEX.setdefault(_w, _i)  # a word listed twice keeps its first number
del _i, _w

Word = Union[int, str]
# Format 2's words: a number out of the table is refused by the decoder itself (no check per word after it).
Word2 = Union[Annotated[int, msgspec.Meta(ge=0, lt=len(WORDS))], str]
_WORD_OF: dict = {**dict(enumerate(WORDS)), None: None}
_word = _WORD_OF.get  # _word(w, w): the word of number w; a string (or None) as itself
_number = _INDEX.get  # _number(s, s): the number of word s, or s itself (None too)


def _w(s: str) -> Word:
    return _INDEX.get(s, s)


def _ow(s: str | None) -> Word | None:
    return None if s is None else _INDEX.get(s, s)


def _ws(items) -> tuple[Word, ...]:
    return tuple([_INDEX.get(s, s) for s in items])


def _s(w: Word) -> str:
    if type(w) is int:
        try:
            return WORDS[w]
        except IndexError:
            raise ValueError(f"invalid encoded state: unknown word number {w}") from None
    return w  # type: ignore[return-value]


def _os(w: Word | None) -> str | None:
    return None if w is None else _s(w)


def _ss(items) -> tuple[str, ...]:
    return tuple([_s(w) for w in items])


# -- the stored shapes (array-like; the wire types keep their own format) ---------
class _StepCount(Struct, array_like=True, frozen=True, tag=0):
    count: int


class _ToolCall(Struct, array_like=True, frozen=True, tag=1):
    tools: tuple[str, ...]


class _LoopFinished(Struct, array_like=True, frozen=True, tag=2):
    pass


class _TokenBudget(Struct, array_like=True, frozen=True, tag=3):
    max_tokens: int


class _Custom(Struct, array_like=True, frozen=True, tag=4):
    name: str
    role: str


_Cond = Union[_StepCount, _ToolCall, _LoopFinished, _TokenBudget, _Custom]


class _Policy(Struct, array_like=True, frozen=True, omit_defaults=True):
    version: str
    stop_when: tuple[_Cond, ...] | None = None
    inactivity_timeout_s: float | None = None  # None: the wire default
    receipt_window_s: float | None = None
    required_outcomes: tuple[Word, ...] = ()


class _RecoveryPolicy(Struct, array_like=True, frozen=True, omit_defaults=True):
    # A recovery policy as a state stores it: an array, its states as word numbers and its actions as their place in
    # RECOVERY_ACTIONS (a number is part of the format: that tuple only grows at its end). A default policy on
    # every run is in every state, so its form decides their size: ~55 bytes where the wire's map took ~220.
    max_attempts: int = 1
    on: tuple[tuple[Word2, Annotated[int, msgspec.Meta(ge=0, lt=len(RECOVERY_ACTIONS))]], ...] = ()
    backoff_s: float = 0.0
    next_policy: _PolicyR | None = None
    idempotent_tools: tuple[str, ...] = ()
    escalate_to: str | None = None


class _PolicyR(_Policy, array_like=True, frozen=True, omit_defaults=True):
    # A policy with a recovery policy has it as one more element; one without is written as before. The wire's
    # map form (a RecoveryPolicy's fields, read as a dict) is still read: states already in changelogs hold it.
    recovery: _RecoveryPolicy | dict | None = None


class _Approval(Struct, array_like=True, frozen=True, omit_defaults=True):
    approval_id: str
    tool_call_id: str
    tool_name: str
    owner: str | None = None
    deadline_ts: int | None = None
    resume_token: str | None = None


class _Segment(Struct, array_like=True, omit_defaults=True):
    steps_seen: int = 0
    max_step: int = -1
    gaps: list[tuple[int, int]] = []
    step_gap: bool = False
    tokens: int = 0
    tool_errors: int = 0
    stop_step: int | None = None
    finish_reason: Word | None = None
    statuses: tuple[Word, ...] = ()
    fired: tuple[str, ...] = ()
    forgot_hi: int = -1  # added later: older records lack it (array_like: the default fills in)
    policy: _PolicyR | None = None  # added later (segment_started), likewise


class _State(Struct, array_like=True, omit_defaults=True):
    run_id: str
    health: Word | None = None
    seq: int = 0
    agent: str | None = None
    policy: _PolicyR | None = None
    last_activity_ts: int | None = None
    last_seen_ts: int = 0
    open: dict[int, _Segment] = {}
    ended: list[int] = []
    current: int = -1
    tool_errors: int = 0
    reported_cause: Word | None = None
    derived_cause: Word | None = None
    fired: tuple[str, ...] = ()
    disagreements: tuple[Word, ...] = ()
    ended_step_count: int = 0
    ended_finish_reason: Word | None = None
    approval: _Approval | None = None
    approval_pending: bool = False
    verify_deadline_ts: int | None = None
    receipt_ids: list[str] = []
    verified_kinds: list[Word] = []
    negative_kinds: list[Word] = []
    ignored: dict[Word, int] = {}
    history: list[tuple[int, int, Word, Word]] = []
    tomb: bool = False  # added later: older records lack it (array_like: the default fills in)
    dropped: int = 0  # added later (events_dropped), likewise
    untrusted_receipt_ids: list[str] = []  # added later, likewise
    expectation_ids: list[str] = []  # added later, likewise
    receipt_trust: dict[str, str] = {}  # added later, likewise
    started_ts: int | None = None  # added later, likewise
    held: list[tuple[str, Word, bool, int]] = []  # added later, likewise


class _Recovery(Struct, array_like=True, omit_defaults=True):
    job_id: str | None = None
    attempt: int = 1
    recovers: str | None = None
    failed_tools: list[str] = []
    named_errors: int = 0
    acted: bool = False
    closed_by: str | None = None
    acknowledged_by: str | None = None
    requests: list[str] = []


# A state with a recovery record is written with it as one more element; a state without is written as
# before (an array_like Struct writes every field, so a trailing None would still cost a byte): its bytes
# do not change. Both decode with the longer shape (a shorter array leaves the default).
class _StateR(_State, array_like=True, omit_defaults=True):
    recovery: _Recovery | None = None


assert _StateR.__struct_fields__ == RunState.__struct_fields__, "codec out of step with RunState"
assert _Recovery.__struct_fields__ == Recovery.__struct_fields__, "codec out of step with Recovery"
assert _Segment.__struct_fields__ == Segment.__struct_fields__, "codec out of step with Segment"

_NIL = msgspec.Raw(b"\xc0")

# Format 2: no run id (the caller's key), times relative to ``last_seen_ts``, ids that hold the run id as
# [before, after] (the id is before + run id + after).
Id = Union[str, tuple[str, str]]


class _Approval2(Struct, array_like=True, frozen=True, omit_defaults=True):
    approval_id: Id
    tool_call_id: Id
    tool_name: str
    owner: str | None = None
    deadline_ts: int | None = None  # minus last_seen_ts
    resume_token: Id | None = None


class _State2(Struct, array_like=True, omit_defaults=True):
    health: Word2 | None = None
    seq: int = 0
    agent: str | None = None
    policy: msgspec.Raw = _NIL  # a _Policy (or nil), as bytes: equal policies are looked up, not decoded
    last_activity_ts: int | None = None  # minus last_seen_ts
    last_seen_ts: int = 0  # the base: the one absolute time
    open: dict[int, _Segment] = {}
    ended: list[int] = []
    current: int = -1
    tool_errors: int = 0
    reported_cause: Word2 | None = None
    derived_cause: Word2 | None = None
    fired: tuple[str, ...] = ()
    disagreements: tuple[Word2, ...] = ()
    ended_step_count: int = 0
    ended_finish_reason: Word2 | None = None
    approval: _Approval2 | None = None
    approval_pending: bool = False
    verify_deadline_ts: int | None = None  # minus last_seen_ts
    receipt_ids: list[Id] = []
    verified_kinds: list[Word2] = []
    negative_kinds: list[Word2] = []
    ignored: dict[Word2, int] = {}
    history: list[tuple[int, int, Word2, Word2]] = []  # ts minus last_seen_ts
    tomb: bool = False
    dropped: int = 0
    untrusted_receipt_ids: list[Id] = []
    expectation_ids: list[Id] = []
    receipt_trust: dict[str, str] = {}
    started_ts: int | None = None  # minus last_seen_ts
    held: list[tuple[Id, Word2, bool, int]] = []  # stamp minus last_seen_ts


class _State2R(_State2, array_like=True, omit_defaults=True):
    recovery: _Recovery | None = None


assert ("run_id", *_State2R.__struct_fields__) == RunState.__struct_fields__, "codec v2 out of step with RunState"


# -- conversions ------------------------------------------------------------------
def _cond_out(c) -> _Cond:
    if isinstance(c, StepCount):
        return _StepCount(c.count)
    if isinstance(c, ToolCallCondition):
        return _ToolCall(tuple(c.tools))
    if isinstance(c, LoopFinished):
        return _LoopFinished()
    if isinstance(c, TokenBudget):
        return _TokenBudget(c.max_tokens)
    if isinstance(c, Custom):
        return _Custom(c.name, c.role)
    raise TypeError(f"not a stop condition: {c!r}")


def _cond_in(c: _Cond):
    if type(c) is _StepCount:
        return StepCount(count=c.count)
    if type(c) is _ToolCall:
        return ToolCallCondition(tools=c.tools)
    if type(c) is _LoopFinished:
        return LoopFinished()
    if type(c) is _TokenBudget:
        return TokenBudget(max_tokens=c.max_tokens)
    return Custom(name=c.name, role=c.role)  # type: ignore[union-attr]


_WIRE_DEFAULT = Policy(version="")
_POLICY_OUT: dict[Policy, _Policy] = {}
_POLICY_IN: dict[_Policy, Policy | None] = {}  # _Policy or _PolicyR
_MEMO_MAX = 4096  # distinct policies are few; the memos start over rather than grow without bound


_ACTION_NUMBER = {a: i for i, a in enumerate(RECOVERY_ACTIONS)}


def _recovery_policy_out(r: RecoveryPolicy) -> _RecoveryPolicy:
    return _RecoveryPolicy(r.max_attempts, tuple([(_number(state, state), _ACTION_NUMBER[a]) for state, a in r.on.items()]),
                           r.backoff_s, None if r.next_policy is None else _policy_out(r.next_policy), r.idempotent_tools,
                           r.escalate_to)


def _recovery_policy_in(r: _RecoveryPolicy | dict) -> RecoveryPolicy:
    try:
        if type(r) is dict:  # the wire's map form (states already in changelogs)
            return msgspec.convert(r, RecoveryPolicy)
        return RecoveryPolicy(max_attempts=r.max_attempts, on={_s(w): RECOVERY_ACTIONS[a] for w, a in r.on},  # type: ignore[misc]
                              backoff_s=r.backoff_s, next_policy=None if r.next_policy is None else _policy_in(r.next_policy),
                              idempotent_tools=r.idempotent_tools,
                              escalate_to=r.escalate_to)
    except (msgspec.ValidationError, ValueError, TypeError) as exc:  # bytes no encoder of ours wrote
        raise ValueError(f"invalid encoded state: recovery policy: {exc}") from None


def _policy_out(p: Policy) -> _Policy:
    try:
        return _POLICY_OUT[p]
    except (KeyError, TypeError):
        pass
    recovery = p.recovery
    out = (_Policy if recovery is UNSET else _PolicyR)(
        p.version,
        None if p.stop_when is None else tuple([_cond_out(c) for c in p.stop_when]),
        None if p.inactivity_timeout_s == _WIRE_DEFAULT.inactivity_timeout_s else p.inactivity_timeout_s,
        None if p.receipt_window_s == _WIRE_DEFAULT.receipt_window_s else p.receipt_window_s,
        _ws(p.required_outcomes),
        *(() if recovery is UNSET else (_recovery_policy_out(recovery),)),  # type: ignore[arg-type]
    )
    try:
        if len(_POLICY_OUT) >= _MEMO_MAX:
            _POLICY_OUT.clear()
        _POLICY_OUT[p] = out
    except TypeError:  # unhashable (built by hand with lists): not memoized
        pass
    return out


def _policy_in(p: _Policy) -> Policy | None:
    recovery = getattr(p, "recovery", None)  # a _Policy has none
    # A recovery policy in the wire's map form (a dict) cannot key the memo: converted each time, as it is rare.
    memo = type(recovery) is not dict
    found = _POLICY_IN.get(p) if memo else None
    if found is not None:
        return found
    policy = intern_policy(Policy(
        version=p.version,
        stop_when=None if p.stop_when is None else tuple([_cond_in(c) for c in p.stop_when]),
        inactivity_timeout_s=_WIRE_DEFAULT.inactivity_timeout_s if p.inactivity_timeout_s is None else p.inactivity_timeout_s,
        receipt_window_s=_WIRE_DEFAULT.receipt_window_s if p.receipt_window_s is None else p.receipt_window_s,
        required_outcomes=_ss(p.required_outcomes),
        recovery=UNSET if recovery is None else _recovery_policy_in(recovery),
    ))
    if memo:
        if len(_POLICY_IN) >= _MEMO_MAX:
            _POLICY_IN.clear()
        _POLICY_IN[p] = policy
    return policy


_POLICY_RAW_OUT: dict[Policy, msgspec.Raw] = {}
_POLICY_RAW_BY_ID: dict[int, tuple[Policy, msgspec.Raw]] = {}  # id(p) -> (p, its bytes)
_POLICY_RAW_IN: dict[bytes, Policy | None] = {b"\xc0": None}
_decode_policy = msgspec.msgpack.Decoder(_PolicyR | None).decode


def _policy_raw_out(p: Policy) -> msgspec.Raw:
    """Format 2's policy: its _Policy's bytes (memoized like :func:`_policy_out`)."""
    # A state's policy is interned (intern_policy): one object per policy, so its identity finds its bytes
    # without hashing it at each write (a policy with a recovery policy hashes that too).
    held = _POLICY_RAW_BY_ID.get(id(p))
    if held is not None:
        return held[1]
    try:
        out = _POLICY_RAW_OUT[p]
    except (KeyError, TypeError):
        out = msgspec.Raw(_encode(_policy_out(p)))
        try:
            if len(_POLICY_RAW_OUT) >= _MEMO_MAX:
                _POLICY_RAW_OUT.clear()
            _POLICY_RAW_OUT[p] = out
        except TypeError:  # unhashable (built by hand with lists): not memoized
            return out
    if len(_POLICY_RAW_BY_ID) >= _MEMO_MAX:
        _POLICY_RAW_BY_ID.clear()
    _POLICY_RAW_BY_ID[id(p)] = (p, out)  # holds p: its id is not reused while the entry is kept
    return out


def _policy_raw_in(raw: msgspec.Raw) -> Policy | None:
    """The policy of format 2's bytes: looked up by them (policies are few), decoded once."""
    key = bytes(raw)
    try:
        return _POLICY_RAW_IN[key]
    except KeyError:
        pass
    try:
        p = _decode_policy(key)
    except msgspec.DecodeError as exc:
        raise ValueError(f"invalid encoded state (version {VERSION}): policy: {exc}") from None
    policy = None if p is None else _policy_in(p)
    if len(_POLICY_RAW_IN) >= _MEMO_MAX:
        _POLICY_RAW_IN.clear()
        _POLICY_RAW_IN[b"\xc0"] = None
    _POLICY_RAW_IN[key] = policy
    return policy


def _approval_out(a: Approval) -> _Approval:
    return _Approval(a.approval_id, a.tool_call_id, a.tool_name, a.owner, a.deadline_ts, a.resume_token)


def _approval_in(a: _Approval) -> Approval:
    return Approval(approval_id=a.approval_id, tool_call_id=a.tool_call_id, tool_name=a.tool_name,
                    owner=a.owner, deadline_ts=a.deadline_ts, resume_token=a.resume_token)


def _segment_out(s: Segment) -> _Segment:
    return _Segment(s.steps_seen, s.max_step, s.gaps, s.step_gap, s.tokens, s.tool_errors, s.stop_step,
                    _ow(s.finish_reason), _ws(s.statuses), s.fired, s.forgot_hi,
                    None if s.policy is None else _policy_out(s.policy))


def _segment_in(s: _Segment) -> Segment:
    return Segment(s.steps_seen, s.max_step, s.gaps, s.step_gap, s.tokens, s.tool_errors, s.stop_step,
                   _os(s.finish_reason), _ss(s.statuses), s.fired, s.forgot_hi,
                   None if s.policy is None else _policy_in(s.policy))


_encode = msgspec.msgpack.Encoder().encode
_decode = msgspec.msgpack.Decoder(_StateR).decode
_decode2 = msgspec.msgpack.Decoder(_State2R).decode


def _recovery_out(r: Recovery) -> _Recovery:
    return _Recovery(r.job_id, r.attempt, r.recovers, r.failed_tools, r.named_errors, r.acted, r.closed_by,
                     r.acknowledged_by, r.requests)


def _recovery_in(r: _Recovery | None) -> Recovery | None:
    if r is None:
        return None
    return Recovery(r.job_id, r.attempt, r.recovers, r.failed_tools, r.named_errors, r.acted, r.closed_by,
                    r.acknowledged_by, r.requests)


def _encode_v1(state: RunState) -> bytes:
    """Format 1 (the run id inside, absolute times): the fallback for a state whose times do not fit format 2."""
    s = state
    out = _State(
        s.run_id,
        _ow(s.health),
        s.seq,
        s.agent,
        None if s.policy is None else _policy_out(s.policy),
        s.last_activity_ts,
        s.last_seen_ts,
        {k: _segment_out(v) for k, v in s.open.items()} if s.open else {},
        s.ended,
        s.current,
        s.tool_errors,
        _ow(s.reported_cause),
        _ow(s.derived_cause),
        s.fired,
        _ws(s.disagreements) if s.disagreements else (),
        s.ended_step_count,
        _ow(s.ended_finish_reason),
        None if s.approval is None else _approval_out(s.approval),
        s.approval_pending,
        s.verify_deadline_ts,
        s.receipt_ids,
        [_INDEX.get(k, k) for k in s.verified_kinds] if s.verified_kinds else [],
        [_INDEX.get(k, k) for k in s.negative_kinds] if s.negative_kinds else [],
        {_INDEX.get(k, k): n for k, n in s.ignored.items()} if s.ignored else {},
        [(seq, ts, _INDEX.get(to, to), _INDEX.get(why, why)) for seq, ts, to, why in s.history],
        s.tomb,
        s.dropped,
        s.untrusted_receipt_ids,
        s.expectation_ids,
        s.receipt_trust,
        s.started_ts,
        [(rid, _INDEX.get(k, k), v, stamp) for rid, k, v, stamp in s.held] if s.held else [],
    )
    if s.recovery is not None:
        out = _StateR(*astuple(out), _recovery_out(s.recovery))
    return _PREFIX_V1 + _encode(out)


def _decode_v1(data: bytes) -> RunState:
    try:
        s = _decode(memoryview(data)[1:])
    except msgspec.DecodeError as exc:  # ValidationError is a DecodeError
        raise ValueError(f"invalid encoded state (version 1): {exc}") from None
    return RunState(
        s.run_id,
        _os(s.health),
        s.seq,
        s.agent,
        None if s.policy is None else _policy_in(s.policy),
        s.last_activity_ts,
        s.last_seen_ts,
        {k: _segment_in(v) for k, v in s.open.items()} if s.open else {},
        s.ended,
        s.current,
        s.tool_errors,
        _os(s.reported_cause),
        _os(s.derived_cause),
        s.fired,
        _ss(s.disagreements) if s.disagreements else (),
        s.ended_step_count,
        _os(s.ended_finish_reason),
        None if s.approval is None else _approval_in(s.approval),
        s.approval_pending,
        s.verify_deadline_ts,
        s.receipt_ids,
        [_s(k) for k in s.verified_kinds] if s.verified_kinds else [],
        [_s(k) for k in s.negative_kinds] if s.negative_kinds else [],
        {_s(k): n for k, n in s.ignored.items()} if s.ignored else {},
        [(seq, ts, _s(to), _s(why)) for seq, ts, to, why in s.history],
        s.tomb,
        s.dropped,
        s.untrusted_receipt_ids,
        s.expectation_ids,
        s.receipt_trust,
        s.started_ts,
        [(rid, _s(k), v, stamp) for rid, k, v, stamp in s.held] if s.held else [],
        None if s.recovery is None else _recovery_in(s.recovery),
    )



def _id_out(x: str, run_id: str) -> Id:
    i = x.find(run_id)
    return x if i < 0 else (x[:i], x[i + len(run_id):])


def _ids_out(ids: list[str], run_id: str) -> list[Id]:
    if len(run_id) < _ID_MIN:
        return ids
    return [x if (i := x.find(run_id)) < 0 else (x[:i], x[i + len(run_id):]) for x in ids]


def _ids_in(ids: list[Id], run_id: str) -> list[str]:
    return [x if type(x) is str else x[0] + run_id + x[1] for x in ids]  # type: ignore[operator]


_ID_MIN = 4  # a shorter run id is not looked for in ids: [before, after] costs 2 bytes more than the id


def encode_state(state: RunState) -> bytes:
    """The compact bytes of ``state`` (format :data:`VERSION`); ``decode_state(bytes, state.run_id)``
    reads them back. The run id is not in them: it is the store's (and the changelog's) key."""
    s = state
    base = s.last_seen_ts
    rid = s.run_id
    n = len(rid) if len(rid) >= _ID_MIN else 0  # 0: ids are kept whole
    a = s.approval
    try:
        out = _State2(
            _number(s.health, s.health),
            s.seq,
            s.agent,
            _NIL if s.policy is None else _policy_raw_out(s.policy),
            None if s.last_activity_ts is None else s.last_activity_ts - base,
            base,
            {k: _segment_out(v) for k, v in s.open.items()} if s.open else {},
            s.ended,
            s.current,
            s.tool_errors,
            _number(s.reported_cause, s.reported_cause),
            _number(s.derived_cause, s.derived_cause),
            s.fired,
            _ws(s.disagreements) if s.disagreements else (),
            s.ended_step_count,
            _number(s.ended_finish_reason, s.ended_finish_reason),
            None if a is None else _Approval2(
                _id_out(a.approval_id, rid) if n else a.approval_id,
                _id_out(a.tool_call_id, rid) if n else a.tool_call_id,
                a.tool_name, a.owner, None if a.deadline_ts is None else a.deadline_ts - base,
                _id_out(a.resume_token, rid) if n and a.resume_token is not None else a.resume_token),
            s.approval_pending,
            None if s.verify_deadline_ts is None else s.verify_deadline_ts - base,
            [x if (i := x.find(rid)) < 0 else (x[:i], x[i + n:]) for x in s.receipt_ids]
            if n and s.receipt_ids else s.receipt_ids,
            [_number(k, k) for k in s.verified_kinds] if s.verified_kinds else [],
            [_number(k, k) for k in s.negative_kinds] if s.negative_kinds else [],
            {_number(k, k): c for k, c in s.ignored.items()} if s.ignored else {},
            [(seq, ts - base, _number(to, to), _number(why, why)) for seq, ts, to, why in s.history],
            s.tomb,
            s.dropped,
            _ids_out(s.untrusted_receipt_ids, rid) if n and s.untrusted_receipt_ids else s.untrusted_receipt_ids,
            _ids_out(s.expectation_ids, rid) if n and s.expectation_ids else s.expectation_ids,
            s.receipt_trust,
            None if s.started_ts is None else s.started_ts - base,
            [(_id_out(r, rid) if n else r, _number(k, k), v, stamp - base) for r, k, v, stamp in s.held]
            if s.held else [],
        )
        data = _encode(out)
        if s.recovery is None:
            return _PREFIX + data
        # A _State2R is the _State2's elements and the recovery record after them: its bytes are the _State2's
        # with the longer array's header, followed by the record's (asserted below). Spliced, not built again
        # as a _State2R from the _State2's fields (astuple, 33 arguments), which cost ~6 % of such a state's encoding.
        return _PREFIX + _HEAD_R + data[_HEAD_LEN:] + _encode(astuple(s.recovery))
    except OverflowError:  # a time so far from last_seen_ts that the difference leaves 64 bits
        return _encode_v1(state)


_HEAD_LEN = 3  # msgpack's array16 header: _State2 and _State2R have 16 to 65,535 fields
_HEAD_R = _encode(_State2R())[:_HEAD_LEN]
assert _encode(_State2())[:_HEAD_LEN] == b"\xdc" + len(_State2.__struct_fields__).to_bytes(2, "big")
assert _HEAD_R == b"\xdc" + len(_State2R.__struct_fields__).to_bytes(2, "big")


def decode_state(data: bytes, run_id: str | None = None) -> RunState:
    """The RunState that :func:`encode_state` turned into ``data``; ``run_id`` is the run's key in the
    store or changelog (format 2 does not hold it; format 1 does, and its own is kept).

    Raises ValueError naming the problem for bytes of an unknown format version, that are not an
    encoded state, or of format 2 without ``run_id``.
    """
    if not data:
        raise ValueError("invalid encoded state: empty")
    version = data[0]
    if version != VERSION:
        if version == V1:
            return _decode_v1(data)
        raise ValueError(f"unknown encoded state format version {version} (this build reads versions {V1} and {VERSION})")
    if type(run_id) is not str:
        raise ValueError(f"encoded state of format version {VERSION} decoded without its run id (the store's key): "
                         f"got {run_id!r}")
    try:
        s = _decode2(memoryview(data)[1:])
    except msgspec.DecodeError as exc:  # ValidationError is a DecodeError
        raise ValueError(f"invalid encoded state (version {version}): {exc}") from None
    base = s.last_seen_ts
    a = s.approval
    return RunState(
        run_id,
        _word(s.health, s.health),
        s.seq,
        s.agent,
        _policy_raw_in(s.policy),
        None if s.last_activity_ts is None else s.last_activity_ts + base,
        base,
        {k: _segment_in(v) for k, v in s.open.items()} if s.open else {},
        s.ended,
        s.current,
        s.tool_errors,
        _word(s.reported_cause, s.reported_cause),
        _word(s.derived_cause, s.derived_cause),
        s.fired,
        tuple([_word(k, k) for k in s.disagreements]) if s.disagreements else (),
        s.ended_step_count,
        _word(s.ended_finish_reason, s.ended_finish_reason),
        None if a is None else _approval_in2(a, run_id, base),
        s.approval_pending,
        None if s.verify_deadline_ts is None else s.verify_deadline_ts + base,
        [x if type(x) is str else x[0] + run_id + x[1] for x in s.receipt_ids] if s.receipt_ids else [],
        [_word(k, k) for k in s.verified_kinds] if s.verified_kinds else [],
        [_word(k, k) for k in s.negative_kinds] if s.negative_kinds else [],
        {_word(k, k): c for k, c in s.ignored.items()} if s.ignored else {},
        [(seq, ts + base, _word(to, to), _word(why, why)) for seq, ts, to, why in s.history],
        s.tomb,
        s.dropped,
        _ids_in(s.untrusted_receipt_ids, run_id) if s.untrusted_receipt_ids else [],
        _ids_in(s.expectation_ids, run_id) if s.expectation_ids else [],
        s.receipt_trust,
        None if s.started_ts is None else s.started_ts + base,
        [(r if type(r) is str else r[0] + run_id + r[1], _word(k, k), v, stamp + base) for r, k, v, stamp in s.held]
        if s.held else [],
        None if s.recovery is None else _recovery_in(s.recovery),
    )


def _approval_in2(a: _Approval2, run_id: str, base: int) -> Approval:
    return Approval(
        approval_id=a.approval_id if type(a.approval_id) is str else a.approval_id[0] + run_id + a.approval_id[1],
        tool_call_id=a.tool_call_id if type(a.tool_call_id) is str else a.tool_call_id[0] + run_id + a.tool_call_id[1],
        tool_name=a.tool_name, owner=a.owner,
        deadline_ts=None if a.deadline_ts is None else a.deadline_ts + base,
        resume_token=a.resume_token if type(a.resume_token) is not tuple else a.resume_token[0] + run_id + a.resume_token[1])


# -- what a listing of runs reads of a state, without decoding the rest ------------
def _listed(cls, name: str, upto: str):
    """``cls``'s fields up to ``upto``, those a listing does not read as Raw (not decoded)."""
    fields = cls.__struct_fields__
    keep = {"health", "seq", "agent", "last_seen_ts", "history", "tomb"}
    n = fields.index(upto) + 1
    defaults = (msgspec.NODEFAULT,) * (len(fields) - len(cls.__struct_defaults__)) + cls.__struct_defaults__
    return msgspec.defstruct(
        name,
        [(f, cls.__annotations__[f], d) if f in keep else (f, msgspec.Raw, msgspec.Raw()) if d is not msgspec.NODEFAULT
         else (f, cls.__annotations__[f]) for f, d in zip(fields[:n], defaults[:n])],
        array_like=True, module=__name__,
    )


_Listed1 = _listed(_State, "_Listed1", "tomb")  # run_id kept: format 1 holds it
_Listed2 = _listed(_State2, "_Listed2", "tomb")
_decode_listed1 = msgspec.msgpack.Decoder(_Listed1).decode
_decode_listed2 = msgspec.msgpack.Decoder(_Listed2).decode


def decode_listing(data: bytes, run_id: str | None = None) -> tuple[int, str, str, str | None, int, str] | None:
    """``(since_ts, run_id, health, agent, seq, reason)`` of an encoded state's last transition, as a list of
    runs shows it (None for a tomb or a run without health), reading only those fields: a fraction of
    :func:`decode_state`. A state without history gives its ``seq`` and ``last_seen_ts`` and reason ``""``.
    ``run_id`` as for :func:`decode_state`.

    Raises ValueError as :func:`decode_state` does."""
    if not data or data[0] != VERSION and data[0] != V1 or data[0] == VERSION and type(run_id) is not str:
        decode_state(data, run_id)  # raises the error naming the problem
    version = data[0]
    try:
        s = _decode_listed2(memoryview(data)[1:]) if version == VERSION else _decode_listed1(memoryview(data)[1:])
    except msgspec.DecodeError as exc:
        raise ValueError(f"invalid encoded state (version {version}): {exc}") from None
    if s.health is None or s.tomb:
        return None
    if version == VERSION:
        base = s.last_seen_ts
        if s.history:
            seq, ts, _to, reason = s.history[-1]
            return ts + base, run_id, _s(s.health), s.agent, seq, _s(reason)  # type: ignore[return-value]
        return base, run_id, _s(s.health), s.agent, s.seq, ""  # type: ignore[return-value]
    if s.history:
        seq, ts, _to, reason = s.history[-1]
        return ts, s.run_id, _s(s.health), s.agent, seq, _s(reason)
    return s.last_seen_ts, s.run_id, _s(s.health), s.agent, s.seq, ""
