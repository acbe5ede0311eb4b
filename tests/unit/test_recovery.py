"""Bounded recovery's decisions (docs/recovery.md), one row per rule, through the pure core."""

from __future__ import annotations

from typing import Any, NamedTuple

import msgspec
import pytest

from loopwarden.codecs.events import Policy, RecoveryPolicy
from loopwarden.rules.recovery import decide

TIGHTER = {"version": "v3-tight", "stop_when": [{"kind": "step_count", "count": 4}]}


def policy(**fields: Any) -> RecoveryPolicy:
    return msgspec.convert(fields, RecoveryPolicy)


class Row(NamedTuple):
    rule: str
    to_state: str
    policy: dict | None
    facts: dict
    action: str | None
    reason: str | None = None
    next_attempt: int | None = None


ROWS = [
    Row("no policy: no automatic action", "STUCK", None, {}, None),
    Row("a state the policy does not name: no action", "BOUNDED_STOP", {"on": {"STUCK": "resume"}}, {}, None),
    Row("STUCK resumes while attempts remain", "STUCK", {"max_attempts": 3, "on": {"STUCK": "resume"}},
        {"attempt": 1}, "resume", "STUCK:inactivity_timeout", 2),
    Row("at the bound a resume becomes an escalation", "STUCK", {"max_attempts": 3, "on": {"STUCK": "resume"}},
        {"attempt": 3}, "escalate", "attempts_exhausted"),
    Row("the default bound is one attempt", "STUCK", {"on": {"STUCK": "restart"}}, {}, "escalate",
        "attempts_exhausted"),
    Row("FAILED restarts when every failed tool is idempotent", "FAILED",
        {"max_attempts": 2, "on": {"FAILED": "restart"}, "idempotent_tools": ["fetch", "read"]},
        {"failed_tools": ["fetch"]}, "restart", "FAILED:inactivity_timeout", 2),
    Row("FAILED escalates when a failed tool is not idempotent", "FAILED",
        {"max_attempts": 2, "on": {"FAILED": "restart"}, "idempotent_tools": ["fetch"]},
        {"failed_tools": ["fetch", "charge_card"]}, "escalate", "FAILED:not_idempotent"),
    Row("a run whose producer lost events is never retried", "STUCK",
        {"max_attempts": 5, "on": {"STUCK": "resume"}}, {"producer_dropped": True}, "escalate",
        "STUCK:producer_dropped"),
    Row("UNCERTAIN escalates when the policy names it", "UNCERTAIN", {"on": {"UNCERTAIN": "escalate"}}, {},
        "escalate", "UNCERTAIN:inactivity_timeout"),
    Row("FALSE_COMPLETE reverifies without a new attempt", "FALSE_COMPLETE",
        {"on": {"FALSE_COMPLETE": "reverify"}}, {}, "reverify", "FALSE_COMPLETE:inactivity_timeout"),
    Row("one automatic action per attempt", "STUCK", {"max_attempts": 3, "on": {"STUCK": "resume"}},
        {"acted": True}, None),
]


@pytest.mark.parametrize("row", ROWS, ids=[r.rule for r in ROWS])
def test_each_recovery_rule(row: Row) -> None:
    """Each rule of bounded recovery decides the action (or none) its row says."""
    got = decide(run_id="inv-42", seq=3, ts=1_000, to_state=row.to_state, reason="inactivity_timeout",
                 policy=None if row.policy is None else policy(**row.policy), policy_version="v3", **row.facts)
    if row.action is None:
        assert got is None
        return
    assert got is not None
    assert (got.action, got.reason, got.next_attempt) == (row.action, row.reason, row.next_attempt)
    assert got.action_id == "inv-42:3" and got.decided_by == "policy:v3"


def test_an_action_names_the_agent_the_job_its_attempt_and_the_next_policy() -> None:
    """A restart carries the run's agent, the job, the next attempt, its policy and a due time after the backoff."""
    p = policy(max_attempts=3, on={"BOUNDED_STOP": "restart"}, backoff_s=30, next_policy=TIGHTER,
               escalate_to="billing-oncall")
    got = decide(run_id="inv-42-a2", seq=4, ts=10_000, to_state="BOUNDED_STOP", reason="stop_condition",
                 policy=p, policy_version="v3", agent="invoices", job_id="inv-42", attempt=2)
    assert got is not None
    assert (got.agent, got.job_id, got.attempt, got.next_attempt) == ("invoices", "inv-42", 2, 3)
    assert got.not_before_ts == 40_000
    assert got.next_policy == msgspec.convert(TIGHTER, Policy)
    assert got.escalate_to == "billing-oncall"


def test_an_escalation_is_due_at_once_and_starts_no_attempt() -> None:
    """An escalation ignores the backoff, names no next attempt and carries no next policy."""
    p = policy(max_attempts=1, on={"STUCK": "resume"}, backoff_s=30, next_policy=TIGHTER)
    got = decide(run_id="r", seq=2, ts=5_000, to_state="STUCK", reason="inactivity_timeout", policy=p,
                 policy_version="v1")
    assert got is not None
    assert (got.action, got.not_before_ts, got.next_attempt, got.next_policy) == ("escalate", 5_000, None, None)


def test_the_job_defaults_to_the_run() -> None:
    """A run without a job id is a job of one attempt named by its run id."""
    got = decide(run_id="r", seq=2, ts=0, to_state="STUCK", reason="inactivity_timeout",
                 policy=policy(max_attempts=2, on={"STUCK": "resume"}), policy_version="v1")
    assert got is not None and got.job_id == "r"


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"on": {"UNCERTAIN": "restart"}}, r"`on.UNCERTAIN`: 'restart' cannot answer UNCERTAIN"),
        ({"on": {"BOUNDED_STOP": "resume"}}, r"`on.BOUNDED_STOP`: 'resume' cannot answer BOUNDED_STOP"),
        ({"on": {"VERIFIED_COMPLETE": "escalate"}}, r"'escalate' cannot answer VERIFIED_COMPLETE"),
        ({"on": {"STUCK": "reboot"}}, r"Invalid enum value 'reboot'"),
        ({"on": {"SLEEPING": "resume"}}, r"Invalid enum value 'SLEEPING'"),
        ({"max_attempts": 0}, r"Expected `int` >= 1 - at `\$.max_attempts`"),
        ({"max_attempt": 3}, r"Object contains unknown field `max_attempt`"),
        ({"next_policy": {"stop_when": []}}, r"missing required field `version` - at `\$.next_policy`"),
        ({"backoff_s": -1}, r"Expected `float` >= 0"),
    ],
)
def test_a_bad_recovery_policy_is_refused_naming_the_value(fields: dict, message: str) -> None:
    """A recovery policy that cannot be followed is refused, and the error names what is wrong."""
    with pytest.raises(msgspec.ValidationError, match=message):
        policy(**fields)
