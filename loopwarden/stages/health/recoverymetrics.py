"""The health stage's bounded-recovery metrics (docs/recovery.md, docs/operations.md). Labels from bounded sets:
``decided_by`` is ``policy`` or ``person`` (never the policy version nor the key id), reasons are the vocabulary's."""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter

from loopwarden.codecs.events import RECOVERY_ACTIONS, RecoveryAction
from loopwarden.codecs.vocabulary import OPERATOR_OUTCOMES
from loopwarden.rules.recovery import ATTEMPTS_EXHAUSTED

ACTION_NAMES = (*RECOVERY_ACTIONS, "abandon", "acknowledge")
DECIDERS = ("policy", "person")
REFUSALS = tuple(o for o in OPERATOR_OUTCOMES if o != "applied")


class RecoveryMetrics:
    """Counters of the recovery actions published and of the operator actions refused."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.actions = Counter("loopwarden_recovery_actions_total",
                               "Recovery actions published on agent.actions, by action and who decided "
                               "(policy or person).", ["action", "decided_by"], registry=registry)
        self.exhausted = Counter("loopwarden_recovery_attempts_exhausted_total",
                                 "Jobs that reached their policy's max_attempts and escalated.", registry=registry)
        self.refused = Counter("loopwarden_operator_actions_refused_total",
                               "Operator actions that changed nothing, by reason (unsigned, unknown_key, stale, "
                               "repeated, closed, attempts_exhausted, unknown_run, ...).", ["reason"], registry=registry)
        for action in ACTION_NAMES:
            for who in DECIDERS:
                self.actions.labels(action, who)
        for reason in REFUSALS:
            self.refused.labels(reason)
        self._children: dict = {}

    def published(self, actions: Iterable[RecoveryAction]) -> None:
        """Count a committed batch's actions."""
        children = self._children
        for a in actions:
            key = (a.action, a.decided_by.startswith("person:"))
            child = children.get(key)
            if child is None:
                child = children[key] = self.actions.labels(a.action, "person" if key[1] else "policy")
            child.inc()
            if a.reason == ATTEMPTS_EXHAUSTED and not key[1]:
                self.exhausted.inc()

    def operator_action(self, outcome: str, n: int = 1) -> None:
        """Count a core note ``("operator_action", outcome)``: refusals only (an applied one is an action)."""
        if outcome != "applied":
            self.refused.labels(outcome).inc(n)
