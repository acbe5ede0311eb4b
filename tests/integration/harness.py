"""Real-Kafka test harness: worker subprocesses, publishing, reading agent.health."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from dev.localkafka import free_port
from loopwarden.publisher import Publisher
from loopwarden.config import Config


def unique_config(bootstrap: str, partitions: int = 4, **kw) -> Config:
    """Topic, group and table names of their own for one test."""
    tag = uuid.uuid4().hex[:8]
    names = dict(app_id=f"lw-{tag}", steps_topic=f"steps-{tag}", outcomes_topic=f"outcomes-{tag}",
                 health_topic=f"health-{tag}", deadletter_topic=f"dead-{tag}", ticks_topic=f"ticks-{tag}",
                 actions_topic=f"actions-{tag}")
    return Config(broker=bootstrap, partitions=partitions, **{**names, **kw})


def env_for(config: Config) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOOPWARDEN_")}
    for name in ("broker", "app_id", "steps_topic", "outcomes_topic", "health_topic", "deadletter_topic",
                 "actions_topic", "ticks_topic", "partitions", "store", "data_dir", "clock", "tick_interval_s", "web_port",
                 "shutdown_timeout_s", "stall_timeout_s", "session_timeout_s", "max_message_bytes", "batch_max_records",
                 "max_future_skew_s", "seq_memory_s", "retention_s", "malloc_trim_s", "commit_gap_ms", "commit_offsets_ms", "batch_wait_ms", "align_max_ms",
                 "otel_topic", "otel_partitions", "topology_check_s",
                 "expand_window_s", "expand_settle_ms", "input_buffer_max_bytes"):
        env["LOOPWARDEN_" + name.upper()] = str(getattr(config, name))
    for name in ("recovery_policies", "token", "security_protocol", "sasl_mechanism", "sasl_username", "sasl_password", "ssl_cafile",
                 "ssl_certfile", "ssl_keyfile"):
        if getattr(config, name) is not None:
            env["LOOPWARDEN_" + name.upper()] = str(getattr(config, name))
    if not config.ssl_check_hostname:
        env["LOOPWARDEN_SSL_CHECK_HOSTNAME"] = "false"
    return env


@dataclass
class Worker:
    """A `loopwarden worker` subprocess (or another long-running command: ``bridge``)."""

    config: Config
    log_path: Path
    proc: subprocess.Popen | None = None
    extra_env: dict = field(default_factory=dict)
    command: str = "worker"
    args: tuple = ()  # extra command-line arguments

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.config.web_port}"

    def start(self, timeout_s: float = 60, ready: bool = True) -> "Worker":
        """Start it and wait for /readyz 200 (``ready=False``: for any answer, e.g. a worker that joins blocked)."""
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen([sys.executable, "-m", "loopwarden.cli", self.command, *self.args],
                                     env={**env_for(self.config), **self.extra_env}, stdout=log, stderr=subprocess.STDOUT)
        self.wait_ready(timeout_s, statuses=(200,) if ready else (200, 503))
        return self

    def get(self, path: str, token: str | None = None) -> tuple[int, bytes]:
        req = urllib.request.Request(self.url + path)
        if token:
            req.add_header("Authorization", f"Bearer {token}")
        try:
            with urllib.request.urlopen(req, timeout=5) as resp:
                return resp.status, resp.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()

    def wait_ready(self, timeout_s: float = 60, statuses: tuple[int, ...] = (200,)) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.command} exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                status, _ = self.get("/readyz", self.config.token)
                if status in statuses:
                    return
            except OSError:
                pass
            time.sleep(0.2)
        raise TimeoutError(f"worker not ready after {timeout_s}s:\n{self.log_tail()}")

    def log_tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 30) -> None:
        if self.proc is not None:
            stop_process(self.proc, sig, timeout_s)


def stop_process(proc: subprocess.Popen, sig: int = signal.SIGTERM, timeout_s: float = 30) -> None:
    """Send ``sig`` to a command the test started and wait ``timeout_s`` for it to end; then kill it."""
    if proc.poll() is not None:
        return
    proc.send_signal(sig)
    try:
        proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


def make_worker(config: Config, tmp: Path, name: str = "w", **overrides) -> Worker:
    from dataclasses import replace

    cfg = replace(config, web_port=free_port(), data_dir=str(tmp / f"data-{name}"), **overrides)
    return Worker(cfg, tmp / f"{name}.log")


async def publish(config: Config, messages: list[tuple]) -> None:
    """Publish (role, key, value) or (role, key, value, headers) in order; role is steps|outcomes."""
    from loopwarden.stages.topics import ensure_topics

    await ensure_topics(config)
    topics = {"steps": config.steps_topic, "outcomes": config.outcomes_topic}
    async with Publisher(config.bootstrap, config.steps_topic, config.outcomes_topic) as pub:
        for role, key, value, *headers in messages:
            await pub.publish_raw(topics[role], key, value, headers=headers[0] if headers else None)
        await pub.flush()


class PublishInBackground(threading.Thread):
    """Publish ``messages`` (simulated fleet messages) in chunks with a pause between them, in a thread,
    while the test kills or moves workers; ``join()`` then check ``errors``."""

    def __init__(self, config: Config, messages: list, chunk: int, pause_s: float) -> None:
        super().__init__(daemon=True)
        self.config, self.messages, self.chunk, self.pause_s = config, messages, chunk, pause_s
        self.errors: list[BaseException] = []
        self.done = threading.Event()

    def run(self) -> None:
        try:
            for i in range(0, len(self.messages), self.chunk):
                run(publish(self.config, [(m.topic, m.key, m.value) for m in self.messages[i:i + self.chunk]]))
                time.sleep(self.pause_s)
        except BaseException as exc:  # noqa: BLE001 - the test reports it
            self.errors.append(exc)
        finally:
            self.done.set()


def sigkill_while_publishing(config: Config, tmp: Path, messages: list, *, chunk: int, min_kills: int,
                             **overrides) -> tuple[Worker, int]:
    """Publish ``messages`` in the background while a worker (event clock, ``overrides``) is SIGKILLed every
    1.5-3 s, mid-batch, and started again, at least ``min_kills`` times and until everything is published.
    Returns the worker left running and the kills."""
    publisher = PublishInBackground(config, messages, chunk=chunk, pause_s=0.4)
    kills = 0
    worker = make_worker(config, tmp, "k0", clock="event", **overrides).start()
    publisher.start()
    while kills < min_kills or not publisher.done.is_set():
        time.sleep(1.5 + (kills % 3) * 0.5)  # mid-batch: transactions in flight
        worker.stop(signal.SIGKILL)
        kills += 1
        worker = make_worker(config, tmp, f"k{kills}", clock="event", **overrides).start()
    publisher.join(60)
    assert not publisher.errors, publisher.errors
    return worker, kills


async def tick(config: Config, now_ms: int) -> None:
    from loopwarden.stages.health.task import Tick, encode_tick

    async with Publisher(config.bootstrap) as pub:
        for p in range(config.partitions):
            await pub.publish_raw(config.ticks_topic, None, encode_tick(Tick(now_ms=now_ms)), partition=p, wait=True)


async def _committed_reader(config: Config, topic: str) -> AIOKafkaConsumer:
    """A started consumer of ``topic`` from its beginning, committed records only, no group."""
    consumer = AIOKafkaConsumer(topic, bootstrap_servers=config.bootstrap, auto_offset_reset="earliest",
                                enable_auto_commit=False, group_id=None, isolation_level="read_committed")
    await consumer.start()
    return consumer


async def group_offsets(config: Config, topic: str) -> dict[int, int]:
    """partition -> the worker group's committed offset on ``topic`` (0: none)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=config.broker)
    await admin.start()
    try:
        offsets = await admin.list_consumer_group_offsets(
            config.app_id, partitions=[TopicPartition(topic, p) for p in range(config.partitions)])
        return {tp.partition: max(0, o.offset) for tp, o in offsets.items()}
    finally:
        await admin.close()


async def create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    """Create ``topic`` with ``partitions`` partitions (replication 1, the local broker's)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, partitions, 1)])
    finally:
        await admin.close()


async def delete_topic(config: Config, topic: str) -> None:
    """Delete ``topic`` and wait until no broker lists it."""
    admin = AIOKafkaAdminClient(bootstrap_servers=config.broker)
    await admin.start()
    try:
        await admin.delete_topics([topic])
        while topic in await admin.list_topics():
            await asyncio.sleep(0.1)
    finally:
        await admin.close()


async def stable_end_offsets(bootstrap: str, tps: list, settle_s: float = 15.0) -> dict:
    """``tps``' last stable offsets once every transaction whose records were there when called has its markers.

    The broker answers EndTxn when the commit is decided and writes the markers to the partitions after it,
    so a ``read_committed`` reader may for a moment not see a transaction its producer has seen commit (a
    probe: 147 of 200 commits, by up to 12 ms on an idle broker; longer on a loaded one). Read the high
    watermarks, then the last stable offsets until they reach them (AssertionError after ``settle_s``: a
    transaction left open)."""
    latest = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, group_id=None,
                              isolation_level="read_uncommitted")
    stable = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, group_id=None,
                              isolation_level="read_committed")
    await latest.start()
    await stable.start()
    try:
        marks = await latest.end_offsets(tps)
        deadline = time.monotonic() + settle_s
        while True:
            ends = await stable.end_offsets(tps)
            if all(ends[tp] >= marks[tp] for tp in tps):
                return ends
            assert time.monotonic() < deadline, f"never stable up to {marks} in {settle_s}s: {ends}"
            await asyncio.sleep(0.05)
    finally:
        await stable.stop()
        await latest.stop()


async def read_topic(config: Config, topic: str, until, timeout_s: float = 60) -> list:
    """Read ``topic`` (committed records only) from the beginning until ``until(records)``; returns the records."""
    consumer = await _committed_reader(config, topic)
    records: list = []
    try:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            batch = await consumer.getmany(timeout_ms=500)
            for recs in batch.values():
                records += recs
            if until(records):
                return records
        return records
    finally:
        await consumer.stop()


async def read_all(config: Config, topic: str, timeout_s: float = 120) -> list:
    """Every committed record of ``topic`` as of now: read from the beginning until the position of each
    partition reaches its end offset (the last stable offset, read_committed), however many there are."""
    consumer = await _committed_reader(config, topic)
    records: list = []
    try:
        deadline = time.monotonic() + timeout_s
        end = None
        while True:
            if end is None and consumer.assignment():
                end = await consumer.end_offsets(list(consumer.assignment()))
            if end is not None:
                positions = {tp: await consumer.position(tp) for tp in end}
                if all(positions[tp] >= end[tp] for tp in end):
                    return records
            if time.monotonic() > deadline:
                raise TimeoutError(f"{topic}: read {len(records)} records in {timeout_s}s (ends {end})")
            for recs in (await consumer.getmany(timeout_ms=500)).values():
                records += recs
    finally:
        await consumer.stop()


def transitions(records) -> list[dict]:
    return [json.loads(r.value) for r in records]


def final_states(ts: list[dict]) -> dict[str, str]:
    """Final state per run, taking the highest seq (the consumer-side dedup by (run_id, seq))."""
    best: dict[str, tuple[int, str]] = {}
    for t in ts:
        if t["run_id"] not in best or t["seq"] > best[t["run_id"]][0]:
            best[t["run_id"]] = (t["seq"], t["to_state"])
    return {k: v[1] for k, v in best.items()}


def wait_for(check, timeout_s: float = 30, every_s: float = 0.2, why=None):
    """Poll ``check()`` until it returns something true; that value (TimeoutError after ``timeout_s``, with
    ``why()`` in its message when given: what was seen instead)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(every_s)
    raise TimeoutError("condition not met" + (f"; instead:\n{why()}" if why is not None else ""))


def as_json(event: dict) -> bytes:
    return json.dumps(event).encode()


def run(coro):
    return asyncio.run(coro)


def events_consumed(worker: Worker) -> int:
    """Input messages the worker consumed (steps + outcomes), from its /metrics."""
    from prometheus_client.parser import text_string_to_metric_families

    status, body = worker.get("/metrics", worker.config.token)
    assert status == 200, body
    total = 0
    for family in text_string_to_metric_families(body.decode()):
        if family.name == "loopwarden_events":
            total += sum(s.value for s in family.samples
                         if s.name == "loopwarden_events_total" and s.labels["topic"] != "ticks")
    return int(total)


def wait_consumed(worker: Worker, n: int, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while (seen := events_consumed(worker)) < n:
        if time.monotonic() > deadline:
            raise TimeoutError(f"worker consumed {seen} of {n} input messages in {timeout_s}s:\n{worker.log_tail()}")
        time.sleep(0.3)
