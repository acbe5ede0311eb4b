"""What the health stage's fold does to a run_started or an operator action before the core (docs/recovery.md).

The fold tests each event's type against :data:`PREPARED` (or :data:`ACTIONS_ONLY` when no agent has a
default recovery policy) once, and hands the few that match to :func:`prepare`: a run_started gets its
agent's default recovery policy (the run's own comes first), an operator action is classified by the
key that signed it, or dead-lettered when it names a run the partition does not hold.
"""

from __future__ import annotations

from collections.abc import Mapping

from loopwarden.codecs.events import OperatorAction, RecoveryPolicy, RunStarted
from loopwarden.engine.stage import DeadLetter
from loopwarden.rules.machine import RunState, unknown_run
from loopwarden.rules.recovery import with_default
from loopwarden.stages.health.batch import HealthFolded

PREPARED = frozenset((RunStarted, OperatorAction))
ACTIONS_ONLY = frozenset((OperatorAction,))


def prepare(event: RunStarted | OperatorAction, state: RunState | None, rec, role: str, out: HealthFolded,
            defaults: Mapping[str, RecoveryPolicy] | None, keys):
    """The event the core applies, or None when it was dead-lettered (``rec``: its record; ``keys``:
    loopwarden.trust.TrustedVerifiers or None, and then every operator action is refused as untrusted)."""
    if type(event) is RunStarted:
        return event if defaults is None else with_default(event, defaults)
    if unknown_run(state):  # a person's action on a run not held: never made a run
        out.deadletters.append(DeadLetter(rec, "unknown_run", f"operator_action for run {event.run_id!r}, which "
                                          "loopwarden does not hold (never started, or dropped after retention)"))
        out.counts["invalid", role, "unknown_run"] += 1
        out.counts["operator_action", "unknown_run"] += 1
        return None
    return event if keys is None else keys.classify_action(event)
