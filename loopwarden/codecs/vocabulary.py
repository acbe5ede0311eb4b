"""The words loopwarden says about runs, defined once: reasons, disagreements, ignored events, receipt outcomes, timers.

Health states and causes are the wire's own Literals (``loopwarden.codecs.events``).
Everything else that names these words — the rules core (which says them), the
metrics' label sets (``loopwarden.engine.metrics``), the changelog codec's word table
(``loopwarden.rules.codec.WORDS``) and the TypeScript types of the emitter
(``emitters/ai-sdk/src/events.ts``) — is derived from here or checked against it by
``tests/unit/test_vocabulary.py``.
"""

from __future__ import annotations

from typing import Literal

from loopwarden.codecs.events import CAUSES
from loopwarden.codecs.exceptions import InvalidEvent

# Why the segment's verdict is UNCERTAIN (the first one, sorted, is the transition's reason).
Disagreement = Literal[
    "cause_mismatch", "fired_mismatch", "step_count_mismatch", "policy_overrun", "policy_unknown",
    "step_gap", "cause_not_recorded", "tool_error_unseen",
    "producer_dropped",  # section 11: the producer lost events of the run (events_dropped)
]
# Valid events that changed no state, counted in the run's evidence (``ignored``) and in metrics.
Ignored = Literal[
    "duplicate_step", "step_after_end", "duplicate_run_ended", "duplicate_run_started",
    "unmatched_approval", "duplicate_receipt", "untracked_step",
    "duplicate_expectation",  # section 10: an outcome_expected whose expectation_id the run already has
    "late_segment_started",  # section 11: a segment_started after its segment's first step or end
    "stale_receipt",  # section 10: a receipt of an earlier occurrence of the run id (kept as untrusted_stale)
    "refused_operator_action",  # section 12: a person's action that changed nothing (its reason: OperatorOutcome)
]
# How a receipt arrived.
ReceiptOutcome = Literal[
    "on_time", "late", "negative", "held", "duplicate", "orphan", "untracked",
    # section 10, with LOOPWARDEN_TRUSTED_VERIFIERS: kept as untrusted, changed nothing
    "untrusted_unsigned", "untrusted_unknown_key", "untrusted_bad_signature", "untrusted_not_canonical",
    # section 10, any receipt that would count: it answers an earlier occurrence of the run id
    "untrusted_stale",
]
# Timers that fire transitions (their kind is the transition's reason), and retention, which drops runs.
TransitionTimer = Literal["no_progress", "approval_expired", "receipt_window_expired"]
TimerKind = Literal["no_progress", "approval_expired", "receipt_window_expired", "retention"]
# Reasons of transitions that are neither a cause (a verdict's), a disagreement nor a timer's.
EventReason = Literal[
    "started", "progress", "approval_routed", "approval_resolved", "receipt", "negative_receipt",
    "late_receipt", "unclassified",
]
# The kinds of (kind, label) notes the rules core returns for metrics.
NoteKind = Literal["ignored", "disagreement", "cause", "reported_cause", "receipt", "timer", "evicted", "operator_action"]
# What became of a person's operator action (section 12): applied, or why it changed nothing.
OperatorOutcome = Literal[
    "applied", "unsigned", "unknown_key", "bad_signature", "not_canonical", "stale", "repeated", "closed",
    "attempts_exhausted", "unknown_run",
]
# Why a message went to the dead-letter topic: a decode error's, or the shell's own.
ShellInvalid = Literal["key_mismatch", "ts_in_future", "wrong_topic", "internal_error", "wrong_partition", "unknown_run"]

DISAGREEMENTS: tuple[str, ...] = Disagreement.__args__  # type: ignore[attr-defined]
IGNORED: tuple[str, ...] = Ignored.__args__  # type: ignore[attr-defined]
RECEIPT_OUTCOMES: tuple[str, ...] = ReceiptOutcome.__args__  # type: ignore[attr-defined]
TRANSITION_TIMERS: tuple[str, ...] = TransitionTimer.__args__  # type: ignore[attr-defined]
TIMER_KINDS: tuple[str, ...] = TimerKind.__args__  # type: ignore[attr-defined]
EVENT_REASONS: tuple[str, ...] = EventReason.__args__  # type: ignore[attr-defined]
NOTE_KINDS: tuple[str, ...] = NoteKind.__args__  # type: ignore[attr-defined]
OPERATOR_OUTCOMES: tuple[str, ...] = OperatorOutcome.__args__  # type: ignore[attr-defined]
INVALID_REASONS: tuple[str, ...] = InvalidEvent.REASONS + ShellInvalid.__args__  # type: ignore[attr-defined]
# Every reason a health transition can carry: a verdict's is the reported cause (never "unknown": that is
# the disagreement cause_not_recorded) or its first disagreement.
REASONS: tuple[str, ...] = (*EVENT_REASONS, *TRANSITION_TIMERS, *(c for c in CAUSES if c != "unknown"), *DISAGREEMENTS)
