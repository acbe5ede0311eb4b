"""Errors raised by loopwarden.codecs."""

from __future__ import annotations


class InvalidEvent(ValueError):
    """An input message that cannot be decoded or violates the contract.

    ``reason`` is a short code from a bounded set (metric label, dead-letter
    header); ``field`` is the JSON path of the offending field when known and
    ``value`` a short repr of the offending value when known.
    """

    REASONS = (
        "undecodable",
        "too_large",
        "too_deep",
        "unsupported_content_type",
        "missing_type",
        "unknown_type",
        "missing_field",
        "invalid_field",
        "invalid_transition",
    )

    def __init__(self, reason: str, message: str, *, field: str | None = None, value: str | None = None):
        super().__init__(message)
        self.reason = reason
        self.field = field
        self.value = value
