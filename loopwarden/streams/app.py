"""The Faust application: one agent over the input topics, one table of run state.

``build(config)`` returns a :class:`Loopwarden` holding the ``faust.App``; the
worker command runs it with ``faust.Worker``. Topic values are raw bytes, decoded
by loopwarden.codecs inside the agent: a Faust codec error would kill the agent.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections.abc import MutableMapping

import faust
from faust.types import TP

from loopwarden.codecs import encode
from loopwarden.rules import Settings
from loopwarden.streams.config import Config
from loopwarden.streams.logs import quiet_repeats
from loopwarden.streams.topics import ensure_topics
from loopwarden.streams.metrics import Metrics
from loopwarden.streams.processor import DeadLetter, Output, Processor, Tick, encode_tick

log = logging.getLogger("loopwarden.worker")

TABLE = "runs"


def _header(headers, name: str) -> str | None:
    """A header's value as text, from Faust's list-of-pairs or mapping form."""
    if not headers:
        return None
    pairs = headers.items() if isinstance(headers, dict) else headers
    for key, value in pairs:
        if key.lower() == name:
            return value.decode("utf-8", "replace") if isinstance(value, (bytes, bytearray)) else str(value)
    return None


def _pairs(headers) -> list[tuple[str, bytes]]:
    if not headers:
        return []
    pairs = headers.items() if isinstance(headers, dict) else headers
    return [(k, v if isinstance(v, (bytes, bytearray)) else str(v).encode()) for k, v in pairs]


class Loopwarden:
    """The Faust app plus the processor it drives."""

    def __init__(self, config: Config, metrics: Metrics | None = None) -> None:
        self.config = config
        self.metrics = metrics or Metrics()
        self.ready = False
        app = faust.App(
            config.app_id,
            broker=config.broker_url,
            store="rocksdb://" if config.store == "rocksdb" else "memory://",
            datadir=config.data_dir,
            topic_partitions=config.partitions,
            topic_replication_factor=config.replication,
            # Standby replicas would keep other workers' runs in the table; failover
            # replays the changelog instead.
            table_standby_replicas=0,
            consumer_auto_offset_reset="earliest",
            web_enabled=True,
            web_bind=config.web_host,
            web_port=config.web_port,
            web_host=config.web_host,
            canonical_url=config.advertised_url,
            producer_acks=-1,
            # A worker that died is noticed in seconds, not the default minute.
            broker_session_timeout=6.0,
            broker_heartbeat_interval=1.0,
            broker_commit_every=1000,
            broker_commit_interval=1.0,
            stream_wait_empty=False,
            web_in_thread=False,
            # Faust's own pages (/table, /router, stats, graph) would serve table
            # contents without auth: only loopwarden's routes are served.
            web_router_enabled=False,
            web_tables_enabled=False,
            web_stats_enabled=False,
            web_graph_enabled=False,
            web_metrics_enabled=False,
            key_serializer="raw",
            value_serializer="raw",
        )
        self.app = app
        raw = {"key_serializer": "raw", "value_serializer": "raw"}
        self.inputs = app.topic(config.steps_topic, config.outcomes_topic, config.ticks_topic,
                                partitions=config.partitions, **raw)
        self.ticks = app.topic(config.ticks_topic, partitions=config.partitions, **raw)
        self.health = app.topic(config.health_topic, **raw)
        self.deadletter = app.topic(config.deadletter_topic, **raw)
        # Keys are run ids as bytes, values MessagePack of Stored: raw both ways.
        self.table = app.Table(TABLE, default=None, partitions=config.partitions, key_type=bytes, value_type=bytes)
        self.processor = Processor(
            _StoreView(self.table),
            steps_topic=config.steps_topic,
            outcomes_topic=config.outcomes_topic,
            ticks_topic=config.ticks_topic,
            settings=Settings(retention_s=config.retention_s),
            metrics=self.metrics,
            clock=config.clock,
            caught_up=self.caught_up,
        )
        self._wire()

    # -- Faust wiring -------------------------------------------------------------
    def active_partitions(self) -> set[int]:
        return {tp.partition for tp in self.app.assignor.assigned_actives() if tp.topic == self.config.steps_topic}

    def _wire(self) -> None:
        app, config = self.app, self.config

        @self.table.on_recover
        async def _recovered() -> None:
            n = self.processor.rebuild(self.table.items(), self.active_partitions())
            await self.resume_from_checkpoints()
            self.ready = True
            log.info("table recovered: %d runs on partitions %s", n, sorted(self.active_partitions()))

        @app.agent(self.inputs, name="loopwarden.process")
        async def process(stream):
            async for event in stream.events():
                await self.handle(event)

        @app.timer(interval=config.tick_interval_s, name="loopwarden.tick")
        async def _tick() -> None:
            # A tick to each owned partition: timers then fire inside the agent, in
            # stream order, so the changelog captures what they change.
            for tp in self.app.assignor.assigned_actives():
                if tp.topic == config.ticks_topic:
                    await self.ticks.send(value=encode_tick(Tick()), partition=tp.partition, force=True)

        @app.timer(interval=5.0, name="loopwarden.lag")
        async def _lag() -> None:
            await self.update_lag()

        from loopwarden.streams.web import add_routes

        add_routes(self)

    async def resume_from_checkpoints(self) -> None:
        """Make consumption resume where the table's offset checkpoints say.

        Faust seeks every assigned partition to the group's committed offset right
        after the recovery callbacks, and what it commits is its own bookkeeping of
        acked messages, which can run ahead of the state changes the changelog holds
        (its stream acks an event in a ``finally`` even when the handling was
        cancelled at shutdown, and acks messages it skips around a rebalance).
        Committing the checkpoints here, before that seek, makes the seek land on
        them: nothing the table lacks is skipped, and what it already holds is
        skipped as redelivered.
        """
        consumer = self.app.consumer
        inputs = (self.config.steps_topic, self.config.outcomes_topic)
        # A partition with a checkpoint but no offset for one topic has consumed nothing
        # of it yet: from its start (offset 0 resets to the earliest kept).
        offsets = {
            TP(topic, partition): by_topic.get(topic, 0)
            for partition, by_topic in self.processor.offsets.items()
            for topic in inputs
        }
        if not offsets:
            return
        try:
            # Faust's consumer commits only acked offsets through its public API.
            committed = await consumer._commit(offsets)
            # aiokafka's seek_to_committed leaves a partition committed at 0 where it
            # is: seek there too (the later seek to a commit > 0 lands on the same offset).
            for tp, offset in offsets.items():
                await consumer.seek(tp, offset)
        except Exception:
            log.exception("committing the table's checkpoints failed; Faust's committed offsets stand")
            return
        log.info("resuming from the table's checkpoints%s: %s", "" if committed else " (not committed: rebalancing)",
                 ", ".join(f"{tp.topic}[{tp.partition}]@{o}" for tp, o in sorted(offsets.items())))

    def caught_up(self, partition: int) -> bool:
        """Consumed both input topics' partition up to the high watermark last fetched."""
        consumer = self.app.consumer
        for topic in (self.config.steps_topic, self.config.outcomes_topic):
            tp = TP(topic, partition)
            highwater = consumer.highwater(tp)
            if highwater is None:
                return False  # nothing fetched yet: unknown
            consumed = self.processor.offsets.get(partition, {}).get(topic)
            if consumed is None:
                # No checkpoint: nothing consumed from it yet; where the group's commit says.
                committed = consumer._committed_offset.get(tp)
                consumed = committed if committed is not None else 0
            if consumed < highwater:
                return False
        return True

    def _process(self, event) -> Output:
        msg = event.message
        try:
            return self.processor.on_message(
                msg.topic, msg.partition, event.key, event.value, _header(msg.headers, "content-type"), msg.offset
            )
        except Exception as exc:  # a bug of ours must not stop the stream nor lose the message
            log.exception("internal error on %s[%d]@%d; dead-lettered", msg.topic, msg.partition, msg.offset)
            out = Output(deadletter=DeadLetter("internal_error", f"{type(exc).__name__}: {exc}"))
            self.processor.consumed(out, msg.topic, msg.partition, msg.offset)
            return out

    async def _send(self, event, out: Output) -> list:
        msg = event.message
        acks = []
        for t in out.transitions:
            acks.append(await self.health.send(key=t.run_id.encode(), value=encode(t), force=True))
        if out.deadletter is not None:
            log.warning("invalid message on %s[%d]@%d: %s", msg.topic, msg.partition, msg.offset, out.deadletter.error)
            headers = _pairs(msg.headers) + [
                ("error", out.deadletter.error[:2000].encode()),
                ("error_reason", out.deadletter.reason.encode()),
                ("source_topic", msg.topic.encode()),
                ("source_partition", str(msg.partition).encode()),
                ("source_offset", str(msg.offset).encode()),
            ]
            acks.append(await self.deadletter.send(key=event.key, value=event.value, headers=headers, force=True))
        return acks

    async def handle(self, event) -> None:
        """Process one message: publish its transitions (acked), then its state changes.

        The changelog never runs ahead of agent.health: a state change is sent to the
        changelog only after the transitions it caused were acked; a tick's offset
        checkpoint goes last, after the states it covers. A crash resumes from the
        checkpoint; reprocessing an event the state already holds is a no-op, so a
        transition may repeat with the same (run_id, seq) but is never lost.
        Changelog records go straight to the Kafka producer (Faust's own table writes
        go through a buffer whose pre-commit flush gives up after 0.1 s).

        A send that fails (the producer gave up after its own retries) is retried
        until acked: the worker never moves past a message whose effects are not
        durable, so a long broker outage stalls it (visible as lag and as
        ``loopwarden_produce_failures_total``) instead of losing the message.
        """
        out = self._process(event)
        try:
            delay = 0.5
            while True:
                try:
                    await self._deliver(event, out)
                    break
                except Exception as exc:
                    self.metrics.produce_failures.inc()
                    log.error("producing the effects of %s[%d]@%d failed (%s: %s); retrying in %.1fs",
                              event.message.topic, event.message.partition, event.message.offset,
                              type(exc).__name__, exc, delay)
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, 30.0)
            # The RocksDB store picks its shard by the current event's partition.
            self.processor.apply_writes(out)
        finally:
            self.processor.end_batch()  # also when cancelled: half-handled states are not kept

    async def _deliver(self, event, out: Output) -> None:
        """Send the output's transitions and dead letter, await their acks; then its changelog records."""
        acks = await self._send(event, out)
        if acks:
            await asyncio.gather(*acks)
        changelog = self.table.changelog_topic
        acks = []
        for key, raw in out.writes.items():
            acks.append(await changelog.send(key=key, value=raw, partition=event.message.partition,
                                             value_serializer="raw", callback=self.table._on_changelog_sent,
                                             force=True))
        if acks:
            await asyncio.gather(*acks)

    async def update_lag(self) -> None:
        consumer = self.app.consumer
        roles = self.processor.roles
        totals = {role: 0 for role in roles.values()}
        try:
            for tp in self.app.assignor.assigned_actives():
                role = roles.get(tp.topic)
                if role is None:
                    continue
                highwater = consumer.highwater(tp)
                position = await consumer.position(tp)
                if highwater is not None and position is not None:
                    totals[role] += max(0, highwater - position)
        except Exception:  # lag is best effort; never disturb the worker
            log.debug("lag update failed", exc_info=True)
            return
        for role, lag in totals.items():
            self.metrics.lag.labels(role).set(lag)


class _StoreView(MutableMapping):
    """The table's local store, without Faust's changelog writes (Loopwarden.handle sends those)."""

    def __init__(self, table) -> None:
        self._table = table

    def __getitem__(self, key):
        return self._table.data[key]

    def __setitem__(self, key, value) -> None:
        self._table.data[key] = value

    def __delitem__(self, key) -> None:
        del self._table.data[key]

    def __iter__(self):
        return iter(self._table.data)

    def __len__(self) -> int:
        return len(self._table.data)

    def items(self):
        return self._table.data.items()


def build(config: Config, metrics: Metrics | None = None) -> Loopwarden:
    return Loopwarden(config, metrics)


class _Worker(faust.Worker):
    """A Faust worker that exits within ``shutdown_timeout_s`` of being told to stop.

    Faust's consumer can wait forever on a broker that is gone (seen: a worker stuck
    in "Consumer: Stopping..." for 20 minutes). Exiting hard then loses nothing: a
    restarted worker resumes from the table's offset checkpoints.
    """

    def __init__(self, *args, shutdown_timeout_s: float, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._shutdown_timeout_s = shutdown_timeout_s
        self._watchdog: threading.Timer | None = None

    async def on_stop(self) -> None:
        if self._watchdog is None:
            self._watchdog = threading.Timer(self._shutdown_timeout_s, self._exit_now)
            self._watchdog.daemon = True
            self._watchdog.start()
        await super().on_stop()

    def _exit_now(self) -> None:
        log.critical("worker did not stop within %.0fs (broker unreachable?); exiting now", self._shutdown_timeout_s)
        logging.shutdown()
        os._exit(EXIT_STOP_TIMEOUT)


EXIT_STOP_TIMEOUT = 3  # the worker was told to stop and had to be cut short


def run_worker(config: Config) -> None:
    """Create topics, then run one Faust worker until SIGTERM/SIGINT."""
    asyncio.run(ensure_topics(config))
    quiet_repeats()
    lw = build(config)
    worker = _Worker(lw.app, loglevel=config.log_level, quiet=True, redirect_stdouts=False,
                     shutdown_timeout_s=config.shutdown_timeout_s)
    worker.execute_from_commandline()

