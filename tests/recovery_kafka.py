"""What the Kafka tests of bounded recovery share: the fleet as messages, replay's actions, agent.actions read."""

from __future__ import annotations

import json
from pathlib import Path
from typing import NamedTuple

import msgspec

from loopwarden.codecs import decode_input
from loopwarden.codecs.events import RecoveryPolicy
from loopwarden.replay import Replay
from tests.integration.harness import read_topic, run
from tests.recovery_fleet import DEFAULTS

ADVANCE_MS = 3_600_000


class Message(NamedTuple):
    topic: str  # role: steps | outcomes
    key: bytes
    value: bytes


def messages(events: list[dict]) -> list[Message]:
    return [Message("outcomes" if e["type"] == "outcome_receipt" else "steps", e["run_id"].encode(),
                    msgspec.json.encode(e)) for e in events]


def policies_file(tmp: Path) -> str:
    path = tmp / "recovery.json"
    path.write_text(json.dumps(DEFAULTS))
    return str(path)


def replay_actions(events: list[dict]) -> dict[str, dict]:
    """action_id -> the action offline replay decides on these events (clock advanced as the test's tick does)."""
    out: dict[str, dict] = {}
    replay = Replay(recovery_defaults={a: msgspec.convert(p, RecoveryPolicy) for a, p in DEFAULTS.items()},
                    on_action=lambda a: out.setdefault(a.action_id, msgspec.to_builtins(a)))
    for e in events:
        replay.feed(decode_input(msgspec.json.encode(e)))
    replay.advance_to(max(e["ts"] for e in events) + ADVANCE_MS)
    return out


def read_actions(config, count: int, timeout_s: float = 180) -> list[tuple[bytes, dict]]:
    """agent.actions (read_committed) once it holds ``count`` records: (key, action) each."""
    records = run(read_topic(config, config.actions_topic, lambda rs: len(rs) >= count, timeout_s))
    return [(r.key, json.loads(r.value)) for r in records]


def differences(got: list[dict], expected: dict[str, dict]) -> dict:
    """action_id -> {field: (got, expected)} for actions that differ from replay's; missing and extra ones too."""
    by_id = {a["action_id"]: a for a in got}
    out: dict = {}
    for aid in by_id.keys() | expected.keys():
        a, e = by_id.get(aid), expected.get(aid)
        if a is None or e is None:
            out[aid] = "missing" if a is None else "not in replay"
        elif a != e:
            out[aid] = {k: (a.get(k), e.get(k)) for k in a.keys() | e.keys() if a.get(k) != e.get(k)}
    return out
