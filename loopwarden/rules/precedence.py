"""The verdict at a ``run_ended``: spec.md section 5's precedence as an ordered table.

Each rule looks at the segment's :class:`Facts` and returns ``(state, reason)``
or ``None``; the first rule that answers wins.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

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


def _failed(f: Facts) -> Verdict | None:
    if f.cause == "error":
        return "FAILED", "error"
    if f.cause == "tool_error" or f.last_tool_error:
        return "FAILED", "tool_error"
    return None


def _approval(f: Facts) -> Verdict | None:
    if f.cause != "approval_required":
        return None
    routed = f.approval is not None and f.approval.routed
    return ("WAITING" if routed else "WAITING_UNROUTED"), "approval_required"


def _timeout(f: Facts) -> Verdict | None:
    # A timeout is still a timeout when a bound would also have fired.
    return ("STUCK", "timeout") if f.cause == "timeout" else None


def _disagreement(f: Facts) -> Verdict | None:
    return ("UNCERTAIN", f.disagreements[0]) if f.disagreements else None


def _bounded(f: Facts) -> Verdict | None:
    if f.cause == "aborted":
        return "BOUNDED_STOP", "aborted"
    if any(f.roles.get(cid) == "bound" for cid in f.fired):
        return "BOUNDED_STOP", "stop_condition"
    return None


def _completion(f: Facts) -> Verdict | None:
    if f.cause not in ("natural_finish", "unexecuted_tool", "stop_condition"):
        return None
    if f.cause == "stop_condition" and not all(f.roles.get(cid) == "completion" for cid in f.fired):
        return None
    # Receipts already held decide at once, with no pass through VERIFYING.
    if f.receipt_state is not None:
        return f.receipt_state, "receipt"
    return "VERIFYING", f.cause


PRECEDENCE: tuple[tuple[str, Callable[[Facts], Verdict | None]], ...] = (
    ("FAILED", _failed),
    ("WAITING / WAITING_UNROUTED", _approval),
    ("STUCK", _timeout),
    ("UNCERTAIN", _disagreement),
    ("BOUNDED_STOP", _bounded),
    ("completion: receipt verdict", _completion),
)


def verdict(facts: Facts) -> Verdict:
    """Apply :data:`PRECEDENCE`; first match wins."""
    for _name, rule in PRECEDENCE:
        found = rule(facts)
        if found is not None:
            return found
    # Unreachable for valid input (every cause is covered above); never guess "complete".
    return "UNCERTAIN", "unclassified"
