"""A person's operator action (docs/contract.md section 12), built and checked once for `loopwarden act` and the
board: every value it cannot carry is refused with a message naming it."""

from __future__ import annotations

import re
import uuid

import msgspec

from loopwarden.codecs.events import OperatorAction

ACTIONS = ("retry", "reverify", "escalate", "abandon", "acknowledge")
TEXT_MAX = 200  # run id, request id, reason and actor: the contract's bounds
_ACTOR = re.compile(r"^[^\x00-\x1f\x7f]{1,200}$")


class ActionError(ValueError):
    """A value an operator action cannot carry (the message names it)."""


def build_action(run_id: str, action: str, reason: str, *, ts: int, request_id: str | None = None,
                 override_bound: bool = False, actor: str | None = None,
                 run_started_ts: int | None = None) -> OperatorAction:
    """The unsigned :class:`~loopwarden.codecs.events.OperatorAction`; raises :class:`ActionError` naming a bad value.

    ``request_id`` defaults to a fresh UUID: a person's every decision is its own request, and a repeat
    of one (a re-sent command, a double click) is ignored by the worker.
    """
    checks = (("RUN_ID", run_id), ("--reason", reason), ("--request-id", request_id), ("--actor", actor))
    for name, value in checks:
        if value is None:
            continue
        if not value.strip():
            raise ActionError(f"{name}: must not be empty")
        if len(value) > TEXT_MAX:
            raise ActionError(f"{name}: at most {TEXT_MAX} characters, got {len(value)} ({value[:40]!r}...)")
    if action not in ACTIONS:
        raise ActionError(f"action {action[:60]!r}: give one of {', '.join(ACTIONS)}")
    if actor is not None and not _ACTOR.match(actor):
        raise ActionError(f"--actor {actor[:60]!r}: no control characters")
    if run_started_ts is not None and not 0 <= run_started_ts <= 2**53 - 1:
        raise ActionError(f"--run-started-ts {run_started_ts}: a time in ms, between 0 and 2**53 - 1")
    if override_bound and action != "retry":
        raise ActionError(f"--override-bound: only a retry can go beyond the bound, not {action!r}")
    return OperatorAction(
        run_id=run_id, ts=ts, request_id=request_id or str(uuid.uuid4()), action=action, reason=reason,
        override_bound=override_bound, actor=msgspec.UNSET if actor is None else actor,
        run_started_ts=msgspec.UNSET if run_started_ts is None else run_started_ts)
