"""What a checker is, and what it can answer (docs/contract.md section 10).

A checker is a small class with one job: measure one kind of destination. It gets the
expectation (target URI and content-free checks) and a :class:`Context` (the verifier's own
configuration: allow-lists, credentials, limits) and answers with

* :class:`Measured` — the destination answered: ``verified`` and what was measured (evidence,
  never content; for ``verified: false`` a short ``reason``);
* or raises :class:`NotAllowed` (the target is outside the configured allow-lists: never fetched),
  :class:`CannotAsk` (the destination could not be asked: refused, unreachable, timed out — retried
  within the run's receipt window, then counted, no receipt), or :class:`BadExpectation` (the
  checks cannot be applied by this checker: counted, no receipt).

Checkers are plug-ins: the entry point group ``loopwarden.checkers`` maps a name to a class
(see docs/receipts.md). Built-ins: ``file``, ``http``, ``postgresql``, ``json_schema``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

from loopwarden.codecs import OutcomeExpected

Evidence = dict[str, Any]


@dataclass(frozen=True)
class Measured:
    verified: bool
    evidence: Evidence = field(default_factory=dict)
    reason: str | None = None  # why not verified (short code), copied into evidence["reason"]

    def receipt_evidence(self) -> Evidence:
        out = dict(self.evidence)
        if self.reason is not None:
            out["reason"] = self.reason
        return out


class CheckError(Exception):
    """A check that gave no measurement; ``reason`` is a short code (metric label, log)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class NotAllowed(CheckError):
    """The target is outside the verifier's allow-lists: refused, never fetched."""


class CannotAsk(CheckError):
    """The destination could not be asked (refused, unreachable, timed out): retried, then counted."""


class BadExpectation(CheckError):
    """The checks cannot be applied (unknown check, wrong value type, unknown schema name)."""


@dataclass
class Context:
    """What the verifier gives every check: its own configuration (never from events) and limits."""

    config: Any  # loopwarden.verify.config.VerifyConfig
    timeout_s: float
    max_body_bytes: int
    http_session: Any = None  # aiohttp.ClientSession, shared


class Checker(Protocol):
    name: ClassVar[str]

    def accepts(self, expectation: OutcomeExpected) -> bool:
        """Whether this checker is the one for ``expectation`` (by target scheme and checks)."""

    async def check(self, expectation: OutcomeExpected, ctx: Context) -> Measured:
        """Measure the destination; raise NotAllowed, CannotAsk or BadExpectation when it cannot."""


def scalar(checks: dict, name: str, kind: type | tuple[type, ...]) -> Any:
    """``checks[name]`` if present, checked for type (BadExpectation naming it otherwise)."""
    value = checks.get(name)
    if value is None:
        return None
    if not isinstance(value, kind) or isinstance(value, bool) and bool not in (kind if isinstance(kind, tuple) else (kind,)):
        raise BadExpectation("bad_check", f"check {name!r}: {value!r} is not a {getattr(kind, '__name__', kind)}")
    return value


def mapping(checks: dict, name: str) -> dict:
    value = checks.get(name)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise BadExpectation("bad_check", f"check {name!r}: {value!r} is not an object of name = value pairs")
    return value


def known_checks(checks: dict, allowed: tuple[str, ...], checker: str) -> None:
    unknown = sorted(set(checks) - set(allowed))
    if unknown:
        raise BadExpectation("unknown_check", f"checker {checker!r} has no check {unknown[0]!r} "
                             f"(it knows: {', '.join(allowed)})")
