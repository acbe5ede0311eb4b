"""The verdict at a ``run_ended``: docs/contract.md section 5's precedence.

:func:`verdict` takes the segment's :class:`Facts` through the rules in their
order (FAILED, WAITING, STUCK, UNCERTAIN, BOUNDED_STOP, completion by receipts);
the first rule that answers wins.
"""

from __future__ import annotations

from collections.abc import Iterable

from msgspec import Struct

from loopwarden.codecs.events import Approval

VERIFIED_COMPLETE = "VERIFIED_COMPLETE"
FALSE_COMPLETE = "FALSE_COMPLETE"


class Facts(Struct, frozen=True):
    """What is known when a segment ends."""

    cause: str  # reported
    derived_cause: str
    fired: tuple[str, ...]  # derived fired set
    roles: dict[str, str]  # condition id -> bound/completion/none, of the policy in force
    disagreements: tuple[str, ...]  # sorted
    last_tool_error: bool  # a tool call of L has status `error`
    approval: Approval | None
    receipt_state: str | None  # receipt verdict over receipts held so far


Verdict = tuple[str, str]


def receipt_verdict(
    verified_kinds: Iterable[str], negative_kinds: Iterable[str], required: Iterable[str]
) -> str | None:
    """VERIFIED_COMPLETE, FALSE_COMPLETE or None (keep verifying), from receipt kinds."""
    verified, negative, required = set(verified_kinds), set(negative_kinds), set(required)
    if required:
        if required <= verified:
            return VERIFIED_COMPLETE
        if negative & required:
            return FALSE_COMPLETE
        return None
    if verified:
        return VERIFIED_COMPLETE
    if negative:
        return FALSE_COMPLETE
    return None


def verdict(f: Facts) -> Verdict:
    """docs/contract.md section 5's precedence, top to bottom: the first rule that answers wins.

    One function, not a table of rule functions: a verdict is taken at every
    ``run_ended``, and a call per rule cost a quarter of the handler's time."""
    cause = f.cause
    # 1. FAILED
    if cause == "error":
        return "FAILED", "error"
    if cause == "tool_error" or f.last_tool_error:
        return "FAILED", "tool_error"
    # 2. WAITING / WAITING_UNROUTED
    if cause == "approval_required":
        routed = f.approval is not None and f.approval.routed
        return ("WAITING" if routed else "WAITING_UNROUTED"), "approval_required"
    # 3. STUCK: a timeout is still a timeout when a bound would also have fired.
    if cause == "timeout":
        return "STUCK", "timeout"
    # 4. UNCERTAIN: the steps do not bear out what was reported.
    if f.disagreements:
        return "UNCERTAIN", f.disagreements[0]
    # 5. BOUNDED_STOP: aborted, or a bound fired.
    if cause == "aborted":
        return "BOUNDED_STOP", "aborted"
    roles = f.roles
    all_completion = True
    for cid in f.fired:
        role = roles.get(cid)
        if role == "bound":
            return "BOUNDED_STOP", "stop_condition"
        if role != "completion":
            all_completion = False
    # 6. Completion, decided by receipts: a natural finish, an unexecuted tool (an explicit
    #    done signal), or a stop on completion conditions only.
    if cause in ("natural_finish", "unexecuted_tool") or (cause == "stop_condition" and all_completion):
        # Receipts already held decide at once, with no pass through VERIFYING.
        if f.receipt_state is not None:
            return f.receipt_state, "receipt"
        return "VERIFYING", cause
    # Unreachable for valid input (every cause is covered above); never guess "complete".
    return "UNCERTAIN", "unclassified"
