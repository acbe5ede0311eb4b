"""Checkers: built-ins, and plug-ins from the ``loopwarden.checkers`` entry point group."""

from __future__ import annotations

import logging
from importlib.metadata import entry_points

from loopwarden.codecs import OutcomeExpected
from loopwarden.verify.checkers.base import (
    BadExpectation, CannotAsk, Checker, CheckError, Context, Measured, NotAllowed,
)

log = logging.getLogger("loopwarden.verify")
GROUP = "loopwarden.checkers"
# Tried in this order for an expectation (a plug-in comes before the built-ins, so it can take over).
BUILTIN = ("json_schema", "file", "http", "postgresql")


def builtin_checkers() -> dict[str, Checker]:
    from loopwarden.verify.checkers.file import FileChecker
    from loopwarden.verify.checkers.http import HttpChecker
    from loopwarden.verify.checkers.json_schema import JsonSchemaChecker
    from loopwarden.verify.checkers.postgresql import PostgresqlChecker

    return {c.name: c for c in (JsonSchemaChecker(), FileChecker(), HttpChecker(), PostgresqlChecker())}


def load_checkers() -> dict[str, Checker]:
    """Plug-ins first (by entry point name), then the built-ins not replaced by one."""
    found: dict[str, Checker] = {}
    for ep in entry_points(group=GROUP):
        if ep.name in BUILTIN and ep.value.startswith("loopwarden.verify."):
            continue  # our own registration of a built-in
        try:
            found[ep.name] = ep.load()()
        except Exception as exc:  # a broken plug-in is named, and the verifier runs without it
            log.error("checker plug-in %r (%s) failed to load: %s", ep.name, ep.value, exc)
    for name, checker in builtin_checkers().items():
        found.setdefault(name, checker)
    return found


def choose(checkers: dict[str, Checker], expectation: OutcomeExpected) -> Checker | None:
    """The checker for an expectation: ``checks.checker`` is not a thing; the first that accepts it."""
    for checker in checkers.values():
        if checker.accepts(expectation):
            return checker
    return None


__all__ = ["BadExpectation", "CannotAsk", "CheckError", "Checker", "Context", "Measured", "NotAllowed",
           "builtin_checkers", "choose", "load_checkers"]
