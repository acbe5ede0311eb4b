"""Bounded recovery: which action, if any, a run's transition calls for (docs/recovery.md).

:func:`decide` is a pure function of the transition, the job's recovery policy and the attempt, so the
worker and offline replay decide the same actions. The safety rules are fixed here, not configurable:

* no automatic resume, restart or reverify on UNCERTAIN (a policy cannot ask for one:
  :class:`RecoveryPolicy` refuses it) or on a run whose producer lost events (``producer_dropped``):
  what happened is unknown, so a person is told instead;
* FAILED is restarted only when every failed tool is declared idempotent: repeating any other tool
  may repeat a side effect that did happen;
* resume and restart only while ``attempt < max_attempts``; at the bound the job escalates with the
  reason ``attempts_exhausted``;
* at most one automatic action per attempt (``acted``): a run that changes state again after its
  action is the fleet's to handle, not a second action's.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

from msgspec import UNSET
from msgspec.structs import replace

from loopwarden.codecs.events import Policy, RecoveryAction, RecoveryPolicy, RunStarted
from loopwarden.rules.conditions import intern_policy

ATTEMPTS_EXHAUSTED = "attempts_exhausted"
# The safety rules' own reasons for an escalation the policy did not ask for.
PRODUCER_DROPPED = "producer_dropped"
NOT_IDEMPOTENT = "not_idempotent"
# Actions that start another attempt of the job: bounded by max_attempts.
NEW_ATTEMPT = frozenset({"resume", "restart"})


def decide(
    *,
    run_id: str,
    seq: int,
    ts: int,
    to_state: str,
    reason: str,
    policy: RecoveryPolicy | None,
    policy_version: str,
    agent: str | None = None,
    job_id: str | None = None,
    attempt: int = 1,
    failed_tools: Collection[str] = (),
    producer_dropped: bool = False,
    acted: bool = False,
) -> RecoveryAction | None:
    """The action that the transition ``seq`` of ``run_id`` to ``to_state`` calls for, or None.

    Parameters
    ----------
    agent:
        The run's agent (from its run_started), named in the action for the fleet's consumers.
    policy:
        The job's recovery policy (the run's own, else the agent's default); None: no automatic action.
    failed_tools:
        Names of the run's tool calls whose status was ``error``.
    acted:
        This attempt already had its automatic action.
    """
    if policy is None or acted:
        return None
    wanted = policy.on.get(to_state)
    if wanted is None:
        return None
    why = f"{to_state}:{reason}"
    action = wanted
    if wanted != "escalate":
        if producer_dropped:
            action, why = "escalate", f"{to_state}:{PRODUCER_DROPPED}"
        elif to_state == "FAILED" and wanted == "restart" and not set(failed_tools) <= set(policy.idempotent_tools):
            action, why = "escalate", f"{to_state}:{NOT_IDEMPOTENT}"
        elif wanted in NEW_ATTEMPT and attempt >= policy.max_attempts:
            action, why = "escalate", ATTEMPTS_EXHAUSTED
    new_attempt = action in NEW_ATTEMPT
    # An escalation is due at once: a person waiting out a backoff learns late for nothing.
    delay_ms = 0 if action == "escalate" else round(policy.backoff_s * 1000)
    return RecoveryAction(  # by position (its fields' order is asserted below): 145 ns, by name 210
        f"{run_id}:{seq}",
        run_id,
        agent,
        job_id or run_id,
        attempt,
        attempt + 1 if new_attempt else None,
        action,
        why,
        ts,
        ts + delay_ms,
        policy.next_policy if new_attempt else None,
        policy.escalate_to,
        f"policy:{policy_version}",
    )


assert RecoveryAction.__struct_fields__[:13] == (
    "action_id", "run_id", "agent", "job_id", "attempt", "next_attempt", "action", "reason", "ts", "not_before_ts",
    "next_policy", "escalate_to", "decided_by",
), "decide builds RecoveryAction by position: out of step with its fields"


# The key of a default for every agent without its own, in the processor's per-agent defaults.
ANY_AGENT = "*"


def with_default(event: RunStarted, defaults: Mapping[str, RecoveryPolicy]) -> RunStarted:
    """``event`` with its agent's default recovery policy when it declares none (the run's own comes first).

    The shells (the worker and replay) call it on each run_started before the core applies it, so a run's
    policy is fixed when it starts: a later change of the defaults does not change a started job's bound.
    """
    policy = event.policy
    if policy.recovery is not UNSET:
        return event
    default = defaults.get(event.agent) or defaults.get(ANY_AGENT)
    if default is None:
        return event
    # The core interns the run's policy anyway (intern_policy, then an identity check); interned first, it keys
    # the defaulted policies by identity, so neither the run's policy nor the defaulted one is hashed per run.
    policy = intern_policy(policy)  # type: ignore[assignment]
    entry = _DEFAULTED.get((id(policy), id(default)))
    if entry is None:  # an entry holds both objects: their ids are not reused while it is kept
        if len(_DEFAULTED) >= 4096:
            _DEFAULTED.clear()
        entry = _DEFAULTED[id(policy), id(default)] = (policy, default,
                                                         intern_policy(replace(policy, recovery=default)))
    return replace(event, policy=entry[2])


# (id of an interned policy, id of a default) -> (that policy, that default, the policy with the default)
_DEFAULTED: dict[tuple[int, int], tuple[Policy, RecoveryPolicy, Policy]] = {}
