"""The engine's one switch over the fetch (``loopwarden.engine.pauses``), and alignment pausing the input
running ahead instead of folding held records out of order (``Alignment.pause_ahead``, ``InputBound.unhold``)."""

from __future__ import annotations

from collections import namedtuple

from aiokafka import TopicPartition
from prometheus_client import CollectorRegistry

from loopwarden.engine.alignment import HOLD_MAX, Alignment
from loopwarden.engine.inputbound import InputBound
from loopwarden.engine.metrics import EngineMetrics
from loopwarden.engine.pauses import Pauses

STEPS, OUTCOMES = "agent.steps", "agent.outcomes"
ROLES = {STEPS: "steps", OUTCOMES: "outcomes"}


class Consumer:
    """What the consumer was told: the partitions paused now, and every call in order."""

    def __init__(self) -> None:
        self.paused: set[TopicPartition] = set()
        self.calls: list[tuple[str, tuple]] = []

    def pause(self, *tps: TopicPartition) -> None:
        self.calls.append(("pause", tps))
        self.paused.update(tps)

    def resume(self, *tps: TopicPartition) -> None:
        self.calls.append(("resume", tps))
        self.paused.difference_update(tps)


def _pauses() -> tuple[Pauses, Consumer, EngineMetrics]:
    metrics = EngineMetrics(CollectorRegistry())
    pauses = Pauses(lambda reason: metrics.inputs_paused.labels("health", reason))
    pauses.consumer = consumer = Consumer()  # type: ignore[assignment]
    return pauses, consumer, metrics


def _gauge(metrics: EngineMetrics, reason: str) -> float:
    return metrics.registry.get_sample_value("loopwarden_inputs_paused", {"stage": "health", "reason": reason})


def test_a_partition_is_fetched_again_only_once_no_reason_holds_it() -> None:
    """Each reason pauses and resumes its own: the layout's resume does not undo a drop, a resume of a reason
    never given changes nothing, and the consumer hears only of changes; the gauge counts by reason."""
    pauses, consumer, metrics = _pauses()
    a, b = TopicPartition(STEPS, 0), TopicPartition(OUTCOMES, 0)
    assert pauses.pause("dropped", [a, b]) == [a, b]
    assert pauses.pause("layout", [a, b]) == []  # paused already: the consumer is not told again
    assert pauses.resume("layout", [a, b]) == []  # still dropped
    assert consumer.paused == {a, b} and consumer.calls == [("pause", (a, b))]
    assert pauses.resume("ahead", [a]) == []  # never paused for that
    assert pauses.pause("ahead", [b]) == []
    assert (_gauge(metrics, "dropped"), _gauge(metrics, "ahead"), _gauge(metrics, "layout")) == (2, 1, 0)
    assert pauses.resume("dropped", [a, b]) == [a]  # b runs ahead still
    assert consumer.paused == {b} and pauses.paused("ahead") == [b] and pauses.paused("dropped") == []
    pauses.assigned()  # a new assignment: aiokafka fetches everything again, every reason is forgotten
    assert pauses.why == {} and _gauge(metrics, "ahead") == 0


def test_at_hold_max_the_input_held_is_paused_until_nothing_of_it_is_held() -> None:
    """A task holding HOLD_MAX records of the receipts topic (waiting for steps) pauses that topic, not the
    steps it waits for, and does not fold them out of order; once it holds none of them it is fetched again."""
    pauses, consumer, _ = _pauses()
    a = Alignment(None, 3, ROLES, 1000, pauses)  # type: ignore[arg-type]
    rec = namedtuple("rec", "topic timestamp")
    a.folded(HOLD_MAX, [rec(OUTCOMES, 0)], {OUTCOMES}, {"steps"}, now=10.0, wall_ms=0, held={OUTCOMES})
    assert consumer.paused == {TopicPartition(OUTCOMES, 3)}
    assert not a.overdue(10.0)  # waits for the steps, in order
    a.folded(HOLD_MAX - 5, [rec(STEPS, 0)], {STEPS}, {"steps"}, now=10.5, wall_ms=0, held={OUTCOMES})
    assert consumer.paused == {TopicPartition(OUTCOMES, 3)}  # some still held: stays paused
    a.folded(0, [rec(STEPS, 0)], {STEPS}, {"steps"}, now=11.0, wall_ms=0, held=())
    assert consumer.paused == set() and pauses.paused("ahead") == []
    b = Alignment(None, 4, ROLES, 1000)  # type: ignore[arg-type] # no switch to pause with: folded as they are
    b.folded(HOLD_MAX, [rec(OUTCOMES, 0)], {OUTCOMES}, {"steps"}, now=10.0, wall_ms=0, held={OUTCOMES})
    assert b.overdue(10.0)


def test_held_records_filling_the_byte_bound_pause_their_inputs_and_fold_as_they_are_only_without_one() -> None:
    """InputBound.unhold: the partitions holding records pause the inputs they hold (counted once, not at every
    turn while they stay paused) and nothing is folded out of order; a partition with nothing it can pause folds
    what it holds as it is; a rebalance (forget) fetches again what alignment paused."""
    pauses, consumer, metrics = _pauses()

    class Task:
        def __init__(self, holding: int, held_topics: tuple) -> None:
            self.holding, self.held_bytes, self.held_topics = holding, 600 * holding, held_topics

    class Part:
        def __init__(self, number: int, task: Task, switch: Pauses | None) -> None:
            self.number, self.buffered_bytes, self.task = number, 0, task
            self.alignment = Alignment(None, number, ROLES, 1000, switch)  # type: ignore[arg-type]

    bound = InputBound(1000, metrics, "health")
    parts = [Part(0, Task(2, (OUTCOMES,)), pauses), Part(1, Task(0, ()), pauses), Part(2, Task(1, (STEPS,)), pauses)]
    assert bound.full(parts)
    assert not bound.unhold(parts)  # nothing to fold now: fetch the inputs not paused
    assert consumer.paused == {TopicPartition(OUTCOMES, 0), TopicPartition(STEPS, 2)}
    assert not bound.unhold(parts)  # the next turn: paused already, not counted again
    sample = metrics.registry.get_sample_value
    assert sample("loopwarden_input_buffer_full_total", {"stage": "health", "then": "paused"}) == 1
    assert sample("loopwarden_input_buffer_full_total", {"stage": "health", "then": "unaligned"}) == 0
    assert [p.alignment.overdue() for p in parts] == [False, False, False]
    lone = Part(5, Task(3, (OUTCOMES,)), None)
    assert bound.unhold([lone]) and lone.alignment.overdue()  # nothing to pause with: folded as they are
    assert sample("loopwarden_input_buffer_full_total", {"stage": "health", "then": "unaligned"}) == 1
    for part in parts:
        part.alignment.forget()
    assert consumer.paused == set() and pauses.paused("ahead") == []
