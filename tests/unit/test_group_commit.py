"""The group's offsets committed by the consumer after the transactions (GroupCommitter): what it commits and when it
keeps a partition behind. The broker side (generation fencing, recovery from the changelog) is in
tests/integration/test_group_offsets.py."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from aiokafka import TopicPartition
from aiokafka.errors import CommitFailedError, KafkaConnectionError
from prometheus_client import CollectorRegistry

from loopwarden.engine.groupcommit import GroupCommitter
from loopwarden.engine.metrics import EngineMetrics
from loopwarden.engine.partition import AssignedPartition


class _Part:
    """The two attributes of an OwnedPartition the committer reads."""

    def __init__(self, number: int, behind: bool) -> None:
        self.number, self.group_behind = number, behind


class _Consumer:
    """Records the offsets of each commit; ``fail`` raises it instead; ``during`` runs while the commit is in flight."""

    def __init__(self, fail: BaseException | None = None, during=None) -> None:
        self.commits: list[dict] = []
        self.fail, self.during = fail, during

    async def commit(self, offsets: dict) -> None:
        await asyncio.sleep(0)
        if self.during is not None:
            self.during()
        if self.fail is not None:
            raise self.fail
        self.commits.append(dict(offsets))


def _engine(consumer: _Consumer, partitions: dict[int, tuple[dict[str, int], bool, bool]], every_ms: int = 1000):
    """partitions: number -> (committed offsets, owned, group behind)."""
    assigned = {}
    for p, (committed, owned, behind) in partitions.items():
        a = AssignedPartition(p)
        a.committed = dict(committed)
        a.owned = _Part(p, behind) if owned else None
        assigned[p] = a
    registry = CollectorRegistry()
    return SimpleNamespace(config=SimpleNamespace(commit_offsets_ms=every_ms), metrics=EngineMetrics(registry),
                           consumer=consumer, assigned=assigned, registry=registry)


def _count(engine, result: str) -> float:
    return engine.registry.get_sample_value("loopwarden_group_commits_total", {"result": result}) or 0.0


def test_one_commit_carries_every_owned_partition_behind_at_its_committed_offsets() -> None:
    """Partitions behind go in one OffsetCommit at their last committed transaction's offsets; others do not."""
    consumer = _Consumer()
    engine = _engine(consumer, {0: ({"steps": 10, "outcomes": 3}, True, True), 1: ({"steps": 7}, True, False),
                                2: ({"steps": 5}, False, True), 3: ({"steps": 4}, True, True)})
    assert asyncio.run(GroupCommitter(engine).commit())
    assert consumer.commits == [{TopicPartition("steps", 0): 10, TopicPartition("outcomes", 0): 3,
                                 TopicPartition("steps", 3): 4}]
    assert not engine.assigned[0].owned.group_behind and not engine.assigned[3].owned.group_behind
    assert _count(engine, "committed") == 1


def test_nothing_behind_sends_nothing() -> None:
    """No partition behind: no request, and success."""
    consumer = _Consumer()
    engine = _engine(consumer, {0: ({"steps": 10}, True, False)})
    assert asyncio.run(GroupCommitter(engine).commit()) and consumer.commits == []


def test_a_failed_commit_is_counted_and_keeps_the_partition_behind_and_owned() -> None:
    """A refused commit (a rebalance: stale generation) or a lost connection: logged, counted, tried again later."""
    for error in (CommitFailedError(), KafkaConnectionError()):
        engine = _engine(_Consumer(fail=error), {0: ({"steps": 10}, True, True)})
        committer = GroupCommitter(engine)
        assert not asyncio.run(committer.commit())
        assert engine.assigned[0].owned is not None and engine.assigned[0].owned.group_behind
        assert committer.due.is_set() and _count(engine, "failed") == 1


def test_a_transaction_committed_meanwhile_keeps_the_partition_behind() -> None:
    """Offsets that moved while the commit was in flight are not in it: the partition stays behind for the next."""
    engine = _engine(_Consumer(), {0: ({"steps": 10}, True, True)})
    engine.consumer.during = lambda: engine.assigned[0].committed.update(steps=25)
    assert asyncio.run(GroupCommitter(engine).commit())
    assert engine.consumer.commits == [{TopicPartition("steps", 0): 10}]
    assert engine.assigned[0].owned.group_behind


def test_the_task_commits_within_the_interval_once_woken_and_stops() -> None:
    """``behind`` wakes the task: the first commit goes at once, the next one not before the interval."""

    async def scenario() -> list[dict]:
        engine = _engine(_Consumer(), {0: ({"steps": 1}, True, False)}, every_ms=300)
        committer = GroupCommitter(engine)
        committer.start()
        part = engine.assigned[0].owned
        committer.behind(part)
        await asyncio.sleep(0.05)
        engine.assigned[0].committed["steps"] = 2
        committer.behind(part)
        await asyncio.sleep(0.1)
        early = len(engine.consumer.commits)
        await asyncio.sleep(0.35)
        committer.check()
        await committer.stop()
        return [early, *engine.consumer.commits]

    early, *commits = asyncio.run(scenario())
    assert early == 1
    assert commits == [{TopicPartition("steps", 0): 1}, {TopicPartition("steps", 0): 2}]
