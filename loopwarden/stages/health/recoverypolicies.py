"""The agents' default recovery policies (docs/recovery.md): a file the processor reads once, at start.

``LOOPWARDEN_RECOVERY_POLICIES`` (``--recovery-policies`` for replay) names a JSON or TOML file (by its
``.toml`` suffix) mapping an agent's name, or ``*`` for every agent without its own, to a
:class:`~loopwarden.codecs.events.RecoveryPolicy`. A run's own ``policy.recovery`` comes first. A bad
file is refused at start with one line naming the agent and the field: a worker must not run with a
bound it silently dropped.
"""

from __future__ import annotations

import json
import os
import tomllib
from pathlib import Path

import msgspec

from loopwarden.codecs.events import RecoveryPolicy

ENV = "LOOPWARDEN_RECOVERY_POLICIES"


class RecoveryPoliciesError(ValueError):
    """The recovery policies file cannot be used; the message is one line naming the file, agent and field."""


def parse_policies(text: str, source: str, toml: bool = False) -> dict[str, RecoveryPolicy]:
    """The per-agent policies of a file's text (``source`` names it in errors)."""
    try:
        doc = tomllib.loads(text) if toml else json.loads(text)
    except (tomllib.TOMLDecodeError, json.JSONDecodeError) as exc:
        raise RecoveryPoliciesError(f"{source}: not valid {'TOML' if toml else 'JSON'}: {exc}") from None
    if not isinstance(doc, dict):
        raise RecoveryPoliciesError(f"{source}: expected a table of agent name -> recovery policy, "
                                    f"got {type(doc).__name__}")
    out: dict[str, RecoveryPolicy] = {}
    for agent, value in doc.items():
        if not 1 <= len(agent) <= 100:
            raise RecoveryPoliciesError(f"{source}: agent {agent!r}: a name is 1-100 characters")
        try:
            out[agent] = msgspec.convert(value, RecoveryPolicy)
        except (msgspec.ValidationError, ValueError) as exc:
            raise RecoveryPoliciesError(f"{source}: agent {agent!r}: {exc}") from None
    return out


def load_policies(path: str | os.PathLike) -> dict[str, RecoveryPolicy]:
    """The per-agent policies of the file at ``path``; RecoveryPoliciesError when it cannot be used."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise RecoveryPoliciesError(f"{ENV}: cannot read {str(path)!r}: {exc.strerror}") from None
    return parse_policies(text, str(path), toml=str(path).endswith(".toml"))


def policies_from_env(environ: dict | None = None) -> dict[str, RecoveryPolicy]:
    """The policies the setting names; empty when it is unset."""
    path = (os.environ if environ is None else environ).get(ENV, "").strip()
    return load_policies(path) if path else {}
