"""The worker's fold publishes recovery actions (docs/recovery.md) as replay decides them: on agent.actions,
keyed by job id, in the batch of the transition that caused each; a person's action for an unknown run is a
dead letter, never a run."""

from __future__ import annotations

import zlib
from collections import defaultdict

import msgspec

from loopwarden.codecs import decode_input
from loopwarden.codecs.events import OperatorAction, RecoveryAction, RecoveryPolicy
from loopwarden.engine.store import MemoryPartition
from loopwarden.replay import Replay
from loopwarden.rules import Settings
from loopwarden.stages.health.task import PartitionTask, Tick, encode_tick
from tests.builders import Rec
from tests.recovery_fleet import DEFAULTS, recovery_fleet

ROLES = {"agent.steps": "steps", "agent.outcomes": "outcomes", "loopwarden.ticks": "ticks"}
PARTITIONS = 3
EVENTS = recovery_fleet(60)
END_MS = max(e["ts"] for e in EVENTS) + 3_600_000
POLICIES = {agent: msgspec.convert(p, RecoveryPolicy) for agent, p in DEFAULTS.items()}


def topic_of(event: dict) -> str:
    return "agent.outcomes" if event["type"] == "outcome_receipt" else "agent.steps"


def fold_all(batch_size: int, events: list[dict] = EVENTS) -> tuple[list[RecoveryAction], list, list]:
    """Every partition folded in batches, then a tick far ahead: the actions, their output records, dead letters."""
    offsets: dict = defaultdict(int)
    logs: dict[int, list[Rec]] = defaultdict(list)
    for e in events:
        p = zlib.crc32(e["run_id"].encode()) % PARTITIONS
        topic = topic_of(e)
        logs[p].append(Rec(topic, p, offsets[topic, p], e["run_id"].encode(), msgspec.json.encode(e)))
        offsets[topic, p] += 1
    actions, outputs, dead = [], [], []
    for p in range(PARTITIONS):
        store = MemoryPartition()
        task = PartitionTask(p, store, ROLES, settings=Settings(), clock="event", recovery_defaults=POLICIES)
        task.rebuild()
        records = logs[p] + [Rec("loopwarden.ticks", p, 0, None, encode_tick(Tick(now_ms=END_MS)))]
        for i in range(0, len(records), batch_size):
            out = task.fold(records[i:i + batch_size], punctuate=True)
            store.write(out.changes, None)
            task.committed(out)
            actions += out.actions
            outputs += [o for o in out.outputs if o[0] == "agent.actions"]
            dead += out.deadletters
    return actions, outputs, dead


def replayed(events: list[dict] = EVENTS) -> list[RecoveryAction]:
    actions: list[RecoveryAction] = []
    replay = Replay(recovery_defaults=POLICIES, on_action=actions.append)
    for e in events:
        replay.feed(decode_input(msgspec.json.encode(e)))
    replay.advance_to(END_MS)
    return actions


def by_id(actions: list[RecoveryAction]) -> dict[str, RecoveryAction]:
    return {a.action_id: a for a in actions}


def test_the_worker_decides_the_actions_replay_decides_at_any_batch_size() -> None:
    """The fold's actions equal replay's, each action id once, whether a batch holds 1, 7 or every record."""
    expected = by_id(replayed())
    assert {a.action for a in expected.values()} >= {"resume", "restart", "escalate"}
    assert any(a.reason == "attempts_exhausted" for a in expected.values())
    for size in (1, 7, 100_000):
        actions, _, _ = fold_all(size)
        assert len(actions) == len(by_id(actions)) and by_id(actions) == expected, size


def test_actions_go_to_agent_actions_keyed_by_job_id() -> None:
    """Each action is one record on agent.actions, keyed by its job id, its value the action's JSON."""
    actions, outputs, _ = fold_all(7)
    assert len(outputs) == len(actions)
    for (topic, key, value, *_), action in zip(outputs, actions):
        assert key == action.job_id.encode()
        assert msgspec.json.decode(value, type=RecoveryAction) == action


def test_an_operator_action_for_an_unknown_run_is_dead_lettered_with_its_reason() -> None:
    """An operator_action naming a run the worker does not hold is a dead letter `unknown_run`, and no run."""
    ghost = msgspec.to_builtins(OperatorAction(run_id="ghost", ts=5, request_id="q1", action="retry", reason="why"))
    actions, _, dead = fold_all(7, [ghost])
    assert actions == [] and [d.reason for d in dead] == ["unknown_run"]
