"""The OpenTelemetry bridge's topics on a real broker: `topics check|repair` know them, and a layout the
bridge refuses leaves no topic behind, so the count its refusal names is the one that then works."""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import replace

import pytest

from loopwarden.stages.otel.stage import BridgeStage, bridge_config
from loopwarden.engine.metrics import EngineMetrics
from loopwarden.stages.otel.metrics import OtelMetrics
from loopwarden.stages.topics import ensure_topics, otel_topics, partition_count
from tests.integration.harness import unique_config
from tests.integration.test_operator_cli import _create, lw

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


def otel_config(bootstrap: str, **kw):
    return unique_config(bootstrap, partitions=2, otel_topic=f"otlp-{uuid.uuid4().hex[:8]}", **kw)


def counts(config) -> dict[str, int | None]:
    async def read():
        return {t: await partition_count(config, t) for t in otel_topics(config)}

    return asyncio.run(read())


def prepare_bridge(config) -> None:
    asyncio.run(BridgeStage(bridge_config(config), OtelMetrics(EngineMetrics()), config).prepare())


def test_bridge_stage_changelog_is_the_one_topics_names():
    """The changelog the bridge's stage writes is the one `topics` checks and repairs."""
    config = unique_config("127.0.0.1:9", partitions=2)
    assert BridgeStage(bridge_config(config), OtelMetrics(EngineMetrics()), config).changelog_topic == otel_topics(config)[1]


def test_bridge_refusing_an_auto_created_otel_topic_creates_nothing_so_the_count_it_names_works(kafka):
    """A 1-partition otel topic (the Collector's auto-create) with otel_partitions=8: one line naming
    LOOPWARDEN_OTEL_PARTITIONS=1, no changelog created, and the bridge then starts with 1."""
    config = otel_config(kafka.bootstrap, otel_partitions=8)
    asyncio.run(ensure_topics(config))
    asyncio.run(_create(config, {config.otel_topic: 1}))
    res = lw(config, "bridge", "--web-port", "0")
    assert res.returncode == 1, res.stderr
    assert "Traceback" not in res.stderr
    assert res.stderr.strip().splitlines()[-1] == (
        f"loopwarden bridge: the bridge's topics must have otel_partitions=8 partitions each, got {config.otel_topic}=1: "
        "set LOOPWARDEN_OTEL_PARTITIONS=1 to use them as they are, or run `loopwarden topics repair --otel` "
        "(it recreates those holding no records)")
    assert counts(config) == {config.otel_topic: 1, otel_topics(config)[1]: None}
    prepare_bridge(replace(config, otel_partitions=1))
    assert counts(config) == {config.otel_topic: 1, otel_topics(config)[1]: 1}


def test_topics_repair_otel_creates_the_otel_topics_with_otel_partitions(kafka):
    """`topics repair --otel --yes` on an empty broker creates the worker's topics with partitions and the
    bridge's with otel_partitions; `topics check` then says the layout is ok, listing them."""
    config = otel_config(kafka.bootstrap, otel_partitions=3)
    res = lw(config, "topics", "repair", "--otel", "--yes")
    assert res.returncode == 0, res.stderr
    assert f"create {config.otel_topic} with 3 partitions" in res.stdout
    assert counts(config) == dict.fromkeys(otel_topics(config), 3)
    assert asyncio.run(partition_count(config, config.steps_topic)) == 2
    check = lw(config, "topics", "check")
    assert check.returncode == 0, check.stdout + check.stderr
    assert f"{config.otel_topic:<32} 3 partitions, ok (OpenTelemetry bridge)" in check.stdout
    prepare_bridge(config)  # the bridge takes them as they are


def test_topics_check_finds_an_auto_created_otel_topic_and_repair_recreates_it_empty(kafka):
    """An empty otel topic of the broker's default count is shown WRONG by `topics check` (no flag needed once
    it exists) and recreated with otel_partitions by `topics repair`; the bridge then starts."""
    config = otel_config(kafka.bootstrap, otel_partitions=4)
    asyncio.run(ensure_topics(config))
    asyncio.run(_create(config, {config.otel_topic: 1}))
    check = lw(config, "topics", "check")
    assert check.returncode == 1
    assert f"{config.otel_topic:<32} 1 partition: WRONG, otel_partitions=4" in check.stdout
    assert "LOOPWARDEN_OTEL_PARTITIONS=1" in check.stderr
    res = lw(config, "topics", "repair", "--yes")
    assert res.returncode == 0, res.stderr
    assert f"delete and recreate {config.otel_topic} with 4 partitions (it has 1; it holds no records)" in res.stdout
    assert counts(config) == dict.fromkeys(otel_topics(config), 4)
    prepare_bridge(config)


def test_topics_expand_grows_the_workers_topics_and_leaves_the_otel_topics_as_they_are(kafka):
    """`topics expand` grows the worker's co-partitioned topics and says why the bridge's keep their count."""
    config = otel_config(kafka.bootstrap, otel_partitions=3)
    assert lw(config, "topics", "repair", "--otel", "--yes").returncode == 0
    res = lw(config, "topics", "expand", "--to", "4", "--yes")
    assert res.returncode == 0, res.stderr
    assert "keep their partitions: the Collector places each trace by its own partitioner" in res.stdout
    assert asyncio.run(partition_count(config, config.steps_topic)) == 4
    assert counts(config) == dict.fromkeys(otel_topics(config), 3)
