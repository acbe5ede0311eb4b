"""The CLI's rough edges against a real broker: a wrong topic layout is one line and creates nothing,
`topics check|repair` mend it, `tail` filters, `deadletters` reads agent.deadletter, and `simulate`
says how long it will take."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from dataclasses import replace

import pytest

from loopwarden.publisher import Publisher
from loopwarden.stages.topics import ensure_topics, read_layout
from tests.integration.harness import env_for, unique_config

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


def lw(config, *args: str, timeout: float = 90, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "loopwarden.cli", *args], env=env_for(config), capture_output=True,
                          text=True, timeout=timeout, input=stdin)


async def _create(config, topics: dict[str, int]) -> None:
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    admin = AIOKafkaAdminClient(bootstrap_servers=config.bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(t, n, 1) for t, n in topics.items()])
    finally:
        await admin.close()


async def _publish(config, topic: str, records: list[tuple[bytes | None, bytes, list | None]]) -> None:
    async with Publisher(config.bootstrap) as pub:
        for key, value, headers in records:
            await pub.publish_raw(topic, key, value, headers=headers)
        await pub.flush()


@pytest.mark.parametrize("command", ["worker", "simulate"])
def test_a_wrong_partition_count_is_one_line_and_creates_nothing(kafka, command) -> None:
    """Inputs with 4 partitions and partitions=8 (the `make dev` then `simulate` case): one line saying to
    run with --partitions 4, exit 1, and no topic created (a changelog created with 8 partitions would make
    the corrected retry fail too)."""
    config = unique_config(kafka.bootstrap, partitions=4)
    asyncio.run(_create(config, {config.steps_topic: 4, config.outcomes_topic: 4}))
    wrong = replace(config, partitions=8)
    args = ["--web-port", "0"] if command == "worker" else ["--runs", "1"]
    res = lw(wrong, command, *args)
    assert res.returncode == 1, res.stderr
    last = res.stderr.strip().splitlines()
    assert "Traceback" not in res.stderr
    assert last[-1] == (f"loopwarden {command}: topic layout: {config.steps_topic} has 4, {config.outcomes_topic} has 4 "
                        "partitions but partitions=8: run with --partitions 4 (LOOPWARDEN_PARTITIONS=4) to use them as they are")
    layout = asyncio.run(read_layout(config))
    assert set(layout.counts) == {config.steps_topic, config.outcomes_topic}, layout.counts
    asyncio.run(ensure_topics(config))  # the retry with the right count works
    assert asyncio.run(read_layout(config)).ok


def test_topics_check_and_repair_mend_a_changelog_of_the_wrong_count(kafka) -> None:
    """The issue's broken state (inputs 4, an empty changelog of 8): `topics check` says what is wrong
    (exit 1); `topics repair --yes` recreates the empty changelog with 4 and creates the missing topics;
    then `check` is ok. A wrong topic that holds records is never deleted."""
    config = unique_config(kafka.bootstrap, partitions=4)
    asyncio.run(_create(config, {config.steps_topic: 4, config.outcomes_topic: 4, config.changelog_topic: 8}))
    res = lw(config, "topics", "check")
    assert res.returncode == 1
    assert f"{config.changelog_topic}" in res.stdout and "8 partitions: WRONG, partitions=4" in res.stdout
    assert "run `loopwarden topics repair --partitions N`" in res.stderr
    res = lw(config, "topics", "repair")  # no terminal and no --yes: asks nobody, changes nothing
    assert res.returncode == 1 and "run again with --yes" in res.stderr
    assert asyncio.run(read_layout(config)).counts[config.changelog_topic] == 8
    res = lw(config, "topics", "repair", "--yes")
    assert res.returncode == 0, res.stderr
    assert f"delete and recreate {config.changelog_topic} with 4 partitions" in res.stdout
    layout = asyncio.run(read_layout(config))
    assert layout.ok and not layout.missing and layout.counts[config.changelog_topic] == 4, layout
    res = lw(config, "topics", "check")
    assert res.returncode == 0 and "layout ok" in res.stdout

    full = unique_config(kafka.bootstrap, partitions=4)
    asyncio.run(_create(full, {full.steps_topic: 8}))
    asyncio.run(_publish(full, full.steps_topic, [(b"r1", b"{}", None)]))
    res = lw(full, "topics", "repair", "--yes")
    assert res.returncode == 1 and f"{full.steps_topic} (8 partitions) hold records, which repair never deletes" in res.stderr
    assert asyncio.run(read_layout(full)).counts[full.steps_topic] == 8


def _transition(run_id: str, seq: int, to: str, agent: str) -> bytes:
    return json.dumps({"type": "health_transition", "run_id": run_id, "seq": seq, "ts": 1780000000000 + seq,
                       "emitted_ts": 1780000000000 + seq, "agent": agent, "policy_version": "v1",
                       "from_state": None if seq == 1 else "RUNNING", "to_state": to, "reason": "x",
                       "evidence": {"disagreements": []}}).encode()


def test_tail_filters_by_run_state_and_agent(kafka) -> None:
    """`tail --run-id/--state/--agent` print only the matching transitions, --state in any case; a wrong
    --state is one line."""
    config = unique_config(kafka.bootstrap)
    asyncio.run(ensure_topics(config))
    records = [(b"a", _transition("a", 1, "RUNNING", "invoice"), None), (b"a", _transition("a", 2, "STUCK", "invoice"), None),
               (b"b", _transition("b", 1, "RUNNING", "triage"), None), (b"b", _transition("b", 2, "STUCK", "triage"), None),
               (b"c", _transition("c", 1, "RUNNING", "invoice"), None)]
    asyncio.run(_publish(config, config.health_topic, records))

    def tail(*flags: str) -> list[tuple[str, str]]:
        res = lw(config, "tail", "--from-beginning", "--idle-exit-s", "3", "--json", *flags)
        assert res.returncode == 0, res.stderr
        return sorted((t["run_id"], t["to_state"]) for t in map(json.loads, res.stdout.splitlines()))

    assert tail("--state", "STUCK") == [("a", "STUCK"), ("b", "STUCK")]
    assert tail("--agent", "invoice") == [("a", "RUNNING"), ("a", "STUCK"), ("c", "RUNNING")]
    assert tail("--run-id", "b", "--run-id", "c") == [("b", "RUNNING"), ("b", "STUCK"), ("c", "RUNNING")]
    assert tail("--state", "STUCK", "--agent", "triage") == [("b", "STUCK")]
    assert tail("--state", "stuck") == [("a", "STUCK"), ("b", "STUCK")]
    res = lw(config, "tail", "--state", "stuk")
    assert res.returncode == 1 and res.stderr.strip().startswith("loopwarden tail: --state 'stuk' is not a health state")


def test_tail_on_a_missing_topic_says_so_and_creates_nothing(kafka) -> None:
    """`tail --health-topic <typo>` on a broker that auto-creates topics: one line saying the topic does not
    exist, exit 1, and the topic is still missing afterwards (a reader never creates a topic)."""
    from loopwarden.stages.topics import partition_count

    config = unique_config(kafka.bootstrap)
    typo = config.health_topic + "-typo"
    res = lw(config, "tail", "--health-topic", typo, "--idle-exit-s", "2")
    assert res.returncode == 1, res.stderr
    assert "Traceback" not in res.stderr
    assert res.stderr.strip().splitlines() == [
        f"loopwarden tail: topic {typo} does not exist (check --health-topic / LOOPWARDEN_HEALTH_TOPIC; "
        "a worker creates it)"]
    assert asyncio.run(partition_count(config, typo)) is None


def test_deadletters_prints_reason_source_and_a_preview(kafka) -> None:
    """`loopwarden deadletters` prints each dead letter's reason, source topic[partition]@offset, key and a
    text or hex preview, then exits (without --follow); --json gives the same as objects."""
    config = unique_config(kafka.bootstrap)
    asyncio.run(ensure_topics(config))

    def headers(reason: str, offset: int) -> list:
        return [("error", f"invalid event ({reason})".encode()), ("error_reason", reason.encode()),
                ("source_topic", config.steps_topic.encode()), ("source_partition", b"2"),
                ("source_offset", str(offset).encode())]
    asyncio.run(_publish(config, config.deadletter_topic, [
        (b"bad-1", b"{not json", headers("undecodable", 17)),
        (b"bad-2", b"\x00\xff\x10binary", headers("undecodable", 18)),
    ]))
    res = lw(config, "deadletters")
    assert res.returncode == 0, res.stderr
    assert f"undecodable  from {config.steps_topic}[2]@17  key=bad-1  9 B" in res.stdout
    assert "text: {not json" in res.stdout
    assert "hex: 00 ff 10 62 69 6e 61 72 79" in res.stdout
    assert "2 dead letters" in res.stderr
    res = lw(config, "deadletters", "--json")
    letters = [json.loads(line) for line in res.stdout.splitlines()]
    assert [(d["reason"], d["source"], d["preview_kind"]) for d in letters] == [
        ("undecodable", f"{config.steps_topic}[2]@17", "text"), ("undecodable", f"{config.steps_topic}[2]@18", "hex")]

    follow = subprocess.Popen([sys.executable, "-m", "loopwarden.cli", "deadletters", "--follow", "--json"],
                              env=env_for(config), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert json.loads(follow.stdout.readline())["source"].endswith("@17")
        assert json.loads(follow.stdout.readline())["source"].endswith("@18")
        asyncio.run(_publish(config, config.deadletter_topic, [(b"bad-3", b'{"type":"nope"}', headers("unknown_type", 19))]))
        later = json.loads(follow.stdout.readline())  # --follow keeps reading: the new one arrives
        assert (later["reason"], later["source"], later["preview"]) == (
            "unknown_type", f"{config.steps_topic}[2]@19", '{"type":"nope"}')
    finally:
        follow.terminate()
        follow.wait(timeout=30)


def test_simulate_paced_says_how_long_and_that_fast_exists(kafka) -> None:
    """Paced at event time, `simulate` says at once how long it will take and that --fast exists, then
    shows progress."""
    config = unique_config(kafka.bootstrap)
    res = lw(config, "simulate", "--runs", "3", "--rate", "2", "--bad-every", "0", "--progress-every-s", "1")
    assert res.returncode == 0, res.stderr
    lines = res.stderr.splitlines()
    assert lines[0].startswith("loopwarden simulate: publishing ") and "(--fast publishes them at once)" in lines[0]
    assert any(" messages sent, " in line and "--fast" in line for line in lines[1:-1]), lines


def test_tick_without_its_topic_is_one_line_and_creates_nothing(kafka) -> None:
    """`tick` before any worker ran: one line saying what to run, and no ticks topic auto-created (a metadata
    request would let a broker with auto.create.topics.enable create it with the default count)."""
    config = unique_config(kafka.bootstrap)
    res = lw(config, "tick", "--now-ms", "1780000000000")
    assert res.returncode == 1 and "Traceback" not in res.stderr
    assert res.stderr.strip() == (f"loopwarden tick: no topic {config.ticks_topic}: start a worker first, "
                                  "or run `loopwarden topics repair`")
    assert asyncio.run(read_layout(config)).counts == {}


def test_topics_repair_asks_on_a_terminal_and_does_nothing_without_a_yes(kafka) -> None:
    """On a terminal `topics repair` shows its plan and asks; anything but y/yes changes nothing, y repairs."""
    import os
    import pty

    config = unique_config(kafka.bootstrap, partitions=4)
    asyncio.run(_create(config, {config.steps_topic: 4, config.outcomes_topic: 4, config.changelog_topic: 8}))

    def answer(text: str) -> subprocess.CompletedProcess:
        master, slave = pty.openpty()
        try:
            os.write(master, text.encode())
            return subprocess.run([sys.executable, "-m", "loopwarden.cli", "topics", "repair"], env=env_for(config),
                                  stdin=slave, capture_output=True, text=True, timeout=90)
        finally:
            os.close(master)
            os.close(slave)

    no = answer("n\n")
    assert no.returncode == 1 and "go ahead? [y/N]" in no.stdout and "nothing changed" in no.stdout, no.stdout + no.stderr
    assert asyncio.run(read_layout(config)).counts[config.changelog_topic] == 8
    yes = answer("y\n")
    assert yes.returncode == 0 and "repaired: " in yes.stdout, yes.stdout + yes.stderr
    assert asyncio.run(read_layout(config)).ok


def test_topics_check_says_one_partition_in_the_singular(kafka) -> None:
    """A layout of one partition per topic is "1 partition, ok", not "1 partitions"."""
    config = unique_config(kafka.bootstrap, partitions=1)
    asyncio.run(ensure_topics(config))
    res = lw(config, "topics", "check")
    assert res.returncode == 0, res.stderr
    assert f"{config.steps_topic}" in res.stdout and "1 partition, ok" in res.stdout
    assert "1 partitions" not in res.stdout
