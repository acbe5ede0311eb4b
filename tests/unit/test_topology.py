"""What a layout read from the cluster allows the worker to do (loopwarden.stages.health.topology.assess)."""

from __future__ import annotations

import pytest

from loopwarden.engine.config import Config
from loopwarden.stages.health.topology import assess, co_partitioned, outputs

C = Config(partitions=8)
GOOD = {t: 8 for t in co_partitioned(C)} | {C.health_topic: 8, C.deadletter_topic: 3, C.actions_topic: 8}
STARTED = {C.health_topic: 8, C.deadletter_topic: 3, C.actions_topic: 8}


def test_the_layout_the_worker_started_with_allows_everything() -> None:
    """All co-partitioned topics at `partitions`, outputs as they were: fold and produce, no problem."""
    v = assess(C, GOOD, STARTED)
    assert (v.fold, v.produce, v.problems, v.ok) == (True, True, (), True)


@pytest.mark.parametrize("topic", [C.steps_topic, C.outcomes_topic, C.ticks_topic, C.changelog_topic])
def test_an_input_grown_alone_stops_folding_and_names_the_topic(topic: str) -> None:
    """One co-partitioned topic grown 8 -> 12: nothing may be folded; the line names topic and counts."""
    v = assess(C, GOOD | {topic: 12}, STARTED)
    assert not v.fold and v.produce and not v.ok
    assert v.reason() == (f"{topic} has 12 partitions, expected 8: co-partitioning is broken "
                          "(grow all input topics together with `loopwarden topics expand`)")


def test_all_inputs_grown_together_still_differ_from_the_configured_count() -> None:
    """Grown together (12 each) the inputs agree, but this worker was configured for 8: it must not fold."""
    v = assess(C, GOOD | {t: 12 for t in co_partitioned(C)}, STARTED)
    assert not v.fold
    assert len(v.problems) == 4


def test_a_missing_input_stops_folding() -> None:
    """A deleted input topic is named as missing."""
    layout = {k: n for k, n in GOOD.items() if k != C.outcomes_topic}
    v = assess(C, layout, STARTED)
    assert not v.fold and "agent.outcomes is missing (expected 8 partitions)" in v.problems


def test_an_output_recreated_with_another_count_stops_producing() -> None:
    """agent.health deleted and auto-created with 1 partition: produce nothing, say why and what to set."""
    v = assess(C, GOOD | {C.health_topic: 1}, STARTED)
    assert v.fold and not v.produce
    assert v.reason() == ("agent.health has 1 partition, it had 8 when this worker started "
                          "(deleted and re-created? delete it and create it with 8 partitions; "
                          "set auto.create.topics.enable=false on the brokers)")


def test_a_missing_output_stops_producing_and_returns_when_it_is_back() -> None:
    """A deleted output blocks producing; the same layout as at start allows it again."""
    gone = {k: n for k, n in GOOD.items() if k != C.deadletter_topic}
    assert assess(C, gone, STARTED).problems == ("agent.deadletter is missing",)
    assert assess(C, GOOD, STARTED).ok


def test_outputs_may_have_any_count_they_started_with() -> None:
    """Output topics need not be co-partitioned: only a change while running counts."""
    assert outputs(C) == [C.health_topic, C.deadletter_topic, C.actions_topic]
    assert assess(C, GOOD | {C.health_topic: 30}, {C.health_topic: 30, C.deadletter_topic: 3, C.actions_topic: 8}).ok


class _Admin:
    """A broker's answers to repair's reads: the topic is listed, first without its partitions described (a
    deletion and a creation being applied), then with the count a client's auto-create gave it."""

    def __init__(self, topic: str, answers: list[tuple[int, int]]) -> None:
        self.topic, self.answers = topic, answers  # (error code, partitions) per describe, the last one repeated

    async def list_topics(self) -> list[str]:
        return [self.topic]

    async def describe_topics(self, names: list[str]) -> list[dict]:
        code, n = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        return [{"topic": self.topic, "error_code": code, "partitions": [{"partition": p} for p in range(n)]}]


def test_repair_does_not_take_a_topic_it_cannot_describe_yet_for_one_of_the_configured_count() -> None:
    """A repaired topic listed but not yet described with partitions is read again: here it turns out to have the
    1 partition a client's auto-create gave it, which repair must see (it took such a topic for settled and said
    done)."""
    import asyncio

    from loopwarden.engine.topics import TopicLayoutError, _settled

    config = Config(partitions=4)
    topic = config.health_topic
    off = asyncio.run(_settled(_Admin(topic, [(3, 0), (5, 0), (0, 1)]), config, [topic], wait_s=0.3))  # type: ignore[arg-type]
    assert off == {topic: 1}
    assert asyncio.run(_settled(_Admin(topic, [(3, 0), (0, 4)]), config, [topic])) == {}  # type: ignore[arg-type]
    with pytest.raises(TopicLayoutError, match=rf"\['{topic}'\] were created but a broker did not describe"):
        asyncio.run(_settled(_Admin(topic, [(3, 0)]), config, [topic], wait_s=0.3))  # type: ignore[arg-type]
