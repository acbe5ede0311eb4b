"""The Python publisher starts a job's next attempt from a recovery action (docs/actions.md)."""

from __future__ import annotations

import msgspec
import pytest

from loopwarden.codecs import Policy, RunStarted, decode_step_event, encode
from loopwarden.codecs.events import RecoveryAction, RecoveryPolicy
from loopwarden.publisher import next_attempt

BOUNDED = Policy(version="v1", recovery=RecoveryPolicy(max_attempts=3, on={"STUCK": "resume"}))
TIGHTER = Policy(version="v1-tight", inactivity_timeout_s=60.0)


def action(**fields) -> RecoveryAction:
    base = dict(action_id="inv-7:3", run_id="inv-7", agent="invoices", job_id="inv-7", attempt=1, next_attempt=2, action="resume",
                reason="STUCK:inactivity_timeout", ts=1_000, not_before_ts=1_000, next_policy=None, escalate_to=None,
                decided_by="policy:v1")
    return RecoveryAction(**(base | fields))


def test_next_attempt_links_the_new_run_to_the_job_the_attempt_and_the_run_it_recovers() -> None:
    """job_id, attempt (the action's next_attempt) and recovers (the ended run) are filled in."""
    started = next_attempt(action(), run_id="inv-7-a2", agent="invoices", policy=BOUNDED, ts=5_000)
    assert started == RunStarted(run_id="inv-7-a2", ts=5_000, agent="invoices", policy=BOUNDED, job_id="inv-7",
                                 attempt=2, recovers="inv-7")


def test_next_attempt_is_an_event_the_processor_accepts() -> None:
    """The run_started it builds survives the processor's own decoder unchanged."""
    started = next_attempt(action(next_policy=TIGHTER), run_id="inv-7-a2", agent="invoices", policy=BOUNDED)
    assert decode_step_event(encode(started)) == started


def test_the_actions_next_policy_replaces_the_jobs_and_keeps_its_recovery_bound() -> None:
    """next_policy is the attempt's stop policy; the job's recovery carries over when it declares none."""
    started = next_attempt(action(next_policy=TIGHTER), run_id="inv-7-a2", agent="invoices", policy=BOUNDED)
    assert started.policy == msgspec.structs.replace(TIGHTER, recovery=BOUNDED.recovery)
    own = msgspec.structs.replace(TIGHTER, recovery=RecoveryPolicy(max_attempts=2))
    assert next_attempt(action(next_policy=own), "inv-7-a2", "invoices", BOUNDED).policy == own


def test_an_action_that_starts_nothing_is_refused_by_name() -> None:
    """escalate, reverify, abandon and acknowledge have no next attempt: a ValueError names the action."""
    with pytest.raises(ValueError, match=r"'inv-7:3' is 'escalate': it starts no attempt"):
        next_attempt(action(action="escalate", next_attempt=None, reason="attempts_exhausted"), "inv-7-a2", "invoices",
                     BOUNDED)


def test_a_run_id_of_an_earlier_attempt_is_refused() -> None:
    """Each attempt is a run with its own id: reusing the ended run's id is an error naming it."""
    with pytest.raises(ValueError, match=r"run_id 'inv-7' names an earlier attempt of job 'inv-7'"):
        next_attempt(action(), run_id="inv-7", agent="invoices", policy=BOUNDED)
