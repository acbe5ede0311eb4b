"""Wire types of the loopwarden contract (docs/contract.md sections 3 and 6). Imports msgspec only."""

from loopwarden.codecs.events import (
    CAUSES,
    FINISH_REASONS,
    RECEIPT_KINDS,
    ReceiptKind,
    STATES,
    TOOL_STATUSES,
    Approval,
    ApprovalResolved,
    ApprovalRouted,
    Condition,
    Custom,
    Evidence,
    EventsDropped,
    HealthTransition,
    InputEvent,
    LoopFinished,
    OutcomeExpected,
    OutcomeReceipt,
    Policy,
    RunActive,
    RunEnded,
    RunStarted,
    SegmentStarted,
    Signature,
    StepCount,
    StepFinished,
    TokenBudget,
    ToolCall,
    ToolCallCondition,
    Usage,
)
from loopwarden.codecs.canonical import NotCanonical, canonical_json, receipt_signing_bytes
from loopwarden.codecs.exceptions import InvalidEvent
from loopwarden.codecs.wire import (
    JSON,
    MSGPACK,
    decode_input,
    decode_outcome_event,
    decode_step_event,
    decode_transition,
    encode,
    json_schema,
)

__all__ = [
    "CAUSES", "FINISH_REASONS", "RECEIPT_KINDS", "ReceiptKind", "STATES", "TOOL_STATUSES",
    "Approval", "ApprovalResolved", "ApprovalRouted", "Condition", "Custom", "Evidence", "EventsDropped",
    "HealthTransition", "InputEvent", "InvalidEvent", "LoopFinished", "NotCanonical", "OutcomeExpected",
    "OutcomeReceipt", "Policy", "RunActive", "RunEnded", "RunStarted", "SegmentStarted", "Signature", "StepCount",
    "StepFinished", "TokenBudget",
    "ToolCall", "ToolCallCondition", "Usage",
    "JSON", "MSGPACK", "canonical_json", "decode_input", "decode_outcome_event", "decode_step_event",
    "decode_transition", "encode", "json_schema", "receipt_signing_bytes",
]
