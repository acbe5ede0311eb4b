"""How the health stage counts the recovery actions a batch committed (docs/recovery.md, docs/operations.md).

The counters are ``Metrics``' own (the engine's registry); the labels come from bounded sets: the action name,
and ``policy`` or ``person`` for who decided (never the policy version nor the key id).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from loopwarden.codecs.events import RecoveryAction
from loopwarden.engine.metrics import Metrics
from loopwarden.rules.recovery import ATTEMPTS_EXHAUSTED


def count_actions(m: Metrics, actions: Iterable[RecoveryAction]) -> None:
    """Count a committed batch's actions: per (action, policy|person), and the jobs at their bound."""
    by: Counter = Counter()
    for a in actions:
        person = a.decided_by.startswith("person:")
        by[a.action, "person" if person else "policy"] += 1
        if a.reason == ATTEMPTS_EXHAUSTED and not person:
            m.attempts_exhausted.inc()
    for (action, who), n in by.items():
        m.child(m.recovery_actions, action, who).inc(n)
