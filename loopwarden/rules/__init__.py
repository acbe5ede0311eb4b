"""The functional core: stop conditions, cause derivation, precedence, the run state machine.

No I/O, no clock, no Kafka, no metrics: ``now_ms`` is an argument.
"""

from loopwarden.rules.codec import decode_state, encode_state
from loopwarden.rules.conditions import derive_cause, evaluate, is_evaluated
from loopwarden.rules.machine import (
    DEFAULT_SETTINGS,
    TIMER_REASONS,
    Result,
    RunState,
    Settings,
    apply,
    fire_next,
    next_deadline,
)
from loopwarden.rules.precedence import Facts, receipt_verdict, verdict

__all__ = [
    "DEFAULT_SETTINGS", "Facts", "Result", "RunState", "Settings", "TIMER_REASONS",
    "apply", "decode_state", "derive_cause", "encode_state", "evaluate", "fire_next", "is_evaluated",
    "next_deadline", "receipt_verdict", "verdict",
]
