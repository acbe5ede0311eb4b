"""A compact byte form of :class:`RunState`, for the stream processor's store and changelog.

``encode_state`` / ``decode_state`` are exact inverses: ``decode_state(encode_state(s)) == s``.
The format is one version byte, then MessagePack arrays (no field names):

* ``0x01``: the RunState's fields in declaration order; segments likewise; the policy, the approval and the stop conditions as arrays (a
  condition's first element is its kind as a small int; a policy duration equal to
  the wire default as nil); known words (health
  states, causes, finish reasons, tool statuses, reasons, receipt kinds, counted
  kinds) as small ints from :data:`WORDS`, any other string as itself.

A new format gets a new version byte; ``decode_state`` reads every version it
knows and rejects any other with a ValueError naming it. :data:`WORDS` may only
grow at its end (a word's number is part of the format).
"""

from __future__ import annotations

from typing import Union

import msgspec
from msgspec import Struct

from loopwarden.codecs.events import (
    CAUSES,
    FINISH_REASONS,
    RECEIPT_KINDS,
    STATES,
    Approval,
    Custom,
    LoopFinished,
    Policy,
    StepCount,
    TokenBudget,
    ToolCallCondition,
)
from loopwarden.rules.conditions import intern_policy
from loopwarden.rules.machine import RunState, Segment

VERSION = 1
_PREFIX = bytes([VERSION])

# Strings that recur in every state; stored as their index here. Append only.
WORDS: tuple[str, ...] = (
    *STATES,
    *CAUSES,
    *FINISH_REASONS,
    # the tool statuses of format 1 (TOOL_STATUSES has grown since: a word's number is fixed)
    "result", "error", "pending", "approval_requested", "denied",
    *RECEIPT_KINDS,
    # transition reasons that are not already above
    "started", "progress", "approval_routed", "approval_resolved", "receipt", "negative_receipt",
    "late_receipt", "no_progress", "approval_expired", "receipt_window_expired", "unclassified",
    # ignored-event kinds and disagreements
    "duplicate_run_started", "step_after_end", "duplicate_step", "duplicate_run_ended",
    "unmatched_approval", "duplicate_receipt",
    "cause_mismatch", "fired_mismatch", "step_count_mismatch", "policy_overrun", "policy_unknown",
    "step_gap", "cause_not_recorded", "tool_error_unseen",
    # docs/contract.md section 11 (producers)
    "cancelled", "late_segment_started", "producer_dropped",
    # appended (tests/unit/test_vocabulary.py: every word of loopwarden.codecs.vocabulary is here)
    "untracked_step", "duplicate_expectation",
)
_INDEX: dict[str, int] = {}
for _i, _w in enumerate(WORDS):
    _INDEX.setdefault(_w, _i)  # a word listed twice keeps its first number
del _i, _w

Word = Union[int, str]


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
    policy: _Policy | None = None  # added later (segment_started), likewise


class _State(Struct, array_like=True, omit_defaults=True):
    run_id: str
    health: Word | None = None
    seq: int = 0
    agent: str | None = None
    policy: _Policy | None = None
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


assert _State.__struct_fields__ == RunState.__struct_fields__, "codec out of step with RunState"
assert _Segment.__struct_fields__ == Segment.__struct_fields__, "codec out of step with Segment"


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
_POLICY_IN: dict[_Policy, Policy | None] = {}
_MEMO_MAX = 4096  # distinct policies are few; the memos start over rather than grow without bound


def _policy_out(p: Policy) -> _Policy:
    try:
        return _POLICY_OUT[p]
    except (KeyError, TypeError):
        pass
    out = _Policy(
        p.version,
        None if p.stop_when is None else tuple([_cond_out(c) for c in p.stop_when]),
        None if p.inactivity_timeout_s == _WIRE_DEFAULT.inactivity_timeout_s else p.inactivity_timeout_s,
        None if p.receipt_window_s == _WIRE_DEFAULT.receipt_window_s else p.receipt_window_s,
        _ws(p.required_outcomes),
    )
    try:
        if len(_POLICY_OUT) >= _MEMO_MAX:
            _POLICY_OUT.clear()
        _POLICY_OUT[p] = out
    except TypeError:  # unhashable (built by hand with lists): not memoized
        pass
    return out


def _policy_in(p: _Policy) -> Policy | None:
    found = _POLICY_IN.get(p)
    if found is not None:
        return found
    policy = intern_policy(Policy(
        version=p.version,
        stop_when=None if p.stop_when is None else tuple([_cond_in(c) for c in p.stop_when]),
        inactivity_timeout_s=_WIRE_DEFAULT.inactivity_timeout_s if p.inactivity_timeout_s is None else p.inactivity_timeout_s,
        receipt_window_s=_WIRE_DEFAULT.receipt_window_s if p.receipt_window_s is None else p.receipt_window_s,
        required_outcomes=_ss(p.required_outcomes),
    ))
    if len(_POLICY_IN) >= _MEMO_MAX:
        _POLICY_IN.clear()
    _POLICY_IN[p] = policy
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
_decode = msgspec.msgpack.Decoder(_State).decode


def encode_state(state: RunState) -> bytes:
    """The compact bytes of ``state`` (format :data:`VERSION`); ``decode_state`` reads them back."""
    s = state
    return _PREFIX + _encode(_State(
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
    ))


def decode_state(data: bytes) -> RunState:
    """The RunState that :func:`encode_state` turned into ``data``.

    Raises ValueError naming the problem for bytes of an unknown format version or
    that are not an encoded state.
    """
    if not data:
        raise ValueError("invalid encoded state: empty")
    version = data[0]
    if version != VERSION:
        raise ValueError(f"unknown encoded state format version {version} (this build reads version {VERSION})")
    try:
        s = _decode(memoryview(data)[1:])
    except msgspec.DecodeError as exc:  # ValidationError is a DecodeError
        raise ValueError(f"invalid encoded state (version {version}): {exc}") from None
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
    )


# -- what a listing of runs reads of a state, without decoding the rest ------------
_SKIPPED = {"policy", "last_activity_ts"} | set(_State.__struct_fields__[7:24])
_Listed = msgspec.defstruct(  # _State's first 26 fields (to ``tomb``), the unread ones as Raw: not decoded
    "_Listed",
    [("run_id", str)] + [
        (name, msgspec.Raw, msgspec.Raw()) if name in _SKIPPED else (name, _State.__annotations__[name], default)
        for name, default in zip(_State.__struct_fields__[1:26], _State.__struct_defaults__)],
    array_like=True, module=__name__,
)
_decode_listed = msgspec.msgpack.Decoder(_Listed).decode


def decode_listing(data: bytes) -> tuple[int, str, str, str | None, int, str] | None:
    """``(since_ts, run_id, health, agent, seq, reason)`` of an encoded state's last transition, as a list of
    runs shows it (None for a tomb or a run without health), reading only those fields: a fraction of
    :func:`decode_state`. A state without history gives its ``seq`` and ``last_seen_ts`` and reason ``""``.

    Raises ValueError as :func:`decode_state` does."""
    if not data or data[0] != VERSION:
        decode_state(data)  # raises the error naming the problem
    try:
        s = _decode_listed(memoryview(data)[1:])
    except msgspec.DecodeError as exc:
        raise ValueError(f"invalid encoded state (version {VERSION}): {exc}") from None
    if s.health is None or s.tomb:
        return None
    if s.history:
        seq, ts, _to, reason = s.history[-1]
        return ts, s.run_id, _s(s.health), s.agent, seq, _s(reason)
    return s.last_seen_ts, s.run_id, _s(s.health), s.agent, s.seq, ""
