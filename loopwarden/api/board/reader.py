"""The board's reader of agent.health and agent.actions: every partition, committed records only, into a
:class:`Fleet`; and its writer of people's operator actions on agent.steps.

It joins no consumer group (the fleet view needs all partitions, whoever processes
them), starts ``board_lookback_s`` back, picks up partitions added later (and the actions
topic once it exists), ages settled runs out every few seconds, and wakes the server's
streams when the fleet changed.
"""

from __future__ import annotations

import asyncio
import logging
import time

from loopwarden.api.board.fleet import Fleet
from loopwarden.config import Config

log = logging.getLogger("loopwarden.board")
EXPIRE_EVERY_S = 5.0
PARTITIONS_CHECK_S = 30.0


def now_ms() -> int:
    return int(time.time() * 1000)


class Board:
    """The fleet view and who waits for its changes."""

    def __init__(self, config: Config) -> None:
        """Raises ConfigError for a bad ``board_users``, TrustConfigError when ``board_signing_key`` cannot be
        read as a signing key."""
        from loopwarden.api.board.users import parse_users

        self.config = config
        self.fleet = Fleet(settled_ms=int(config.board_settled_s * 1000), max_runs=config.board_max_runs)
        self.users = parse_users(config.board_users, config.token)  # token -> user name
        self.signing_key = None
        if config.board_signing_key:
            from loopwarden.trust import SigningKey

            self.signing_key = SigningKey.load(config.board_signing_key)
        self._publisher = None
        self._publisher_lock = asyncio.Lock()
        self._changed = asyncio.Event()
        self.stopping = asyncio.Event()
        self.ready = False  # caught up with agent.health's end at start
        self.consumed = 0

    def stop(self) -> None:
        self.stopping.set()
        self.notify()

    def notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def changed(self, timeout_s: float) -> None:
        event = self._changed
        stop = asyncio.ensure_future(self.stopping.wait())
        change = asyncio.ensure_future(event.wait())
        try:
            await asyncio.wait({stop, change}, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop.cancel()
            change.cancel()

    @property
    def acting(self) -> bool:
        """Whether people can act from the board: it has a signing key and users to name."""
        return self.signing_key is not None and bool(self.users)

    # -- writing people's actions on agent.steps -------------------------------------------
    async def publish(self, actions: list) -> None:
        """Send signed operator actions to agent.steps, keyed by run id; returns once Kafka acked them all."""
        async with self._publisher_lock:
            if self._publisher is None:
                from loopwarden.engine.security import client_options
                from loopwarden.publisher import Publisher

                publisher = Publisher(self.config.broker, steps_topic=self.config.steps_topic,
                                      options=client_options(self.config))
                await publisher.start()
                self._publisher = publisher
        for action in actions:
            await self._publisher.publish(action)
        await self._publisher.flush()

    async def close(self) -> None:
        if self._publisher is not None:
            await self._publisher.stop()
            self._publisher = None

    # -- reading agent.health and agent.actions ---------------------------------------------
    async def consume(self) -> None:
        """Read every partition of agent.health and agent.actions (committed only) from board_lookback_s ago,
        for ever."""
        from aiokafka import AIOKafkaConsumer, TopicPartition

        from loopwarden.engine.security import client_options

        c = self.config
        consumer = AIOKafkaConsumer(**client_options(c), group_id=None, enable_auto_commit=False,
                                    isolation_level="read_committed", auto_offset_reset="earliest",
                                    fetch_max_wait_ms=50)
        try:
            await consumer.start()
        except BaseException:
            await consumer.stop()
            await self.close()
            raise
        from loopwarden.commands.cliutil import _connected

        _connected()  # aiokafka's own lines pass from now on
        topics = (c.health_topic, c.actions_topic)
        try:
            assigned: dict[str, set[int]] = {topic: set() for topic in topics}
            checked = 0.0
            expired = time.monotonic()
            while not self.stopping.is_set():
                if time.monotonic() - checked > PARTITIONS_CHECK_S or not assigned[c.health_topic]:
                    checked = time.monotonic()
                    await self._assign(consumer, assigned, TopicPartition)
                reading = any(assigned.values())
                batch = await consumer.getmany(timeout_ms=200, max_records=5000) if reading else {}
                if not assigned[c.health_topic]:
                    await asyncio.sleep(1)
                now = now_ms()
                n = 0
                for tp, records in batch.items():
                    add = self.fleet.add_action if tp.topic == c.actions_topic else self.fleet.add
                    for rec in records:
                        if rec.value is not None:
                            add(rec.value, now)
                            n += 1
                self.consumed += n
                if time.monotonic() - expired > EXPIRE_EVERY_S:
                    expired = time.monotonic()
                    if self.fleet.expire(now):
                        n += 1
                if n:
                    self.notify()
                if not self.ready and assigned[c.health_topic] and not batch:
                    self.ready = True
                    log.info("caught up with %s: %d runs on the board", c.health_topic, len(self.fleet.runs))
        finally:
            await consumer.stop()
            await self.close()

    async def _partitions(self, topics) -> dict[str, set[int]]:
        """Each topic's partitions now, none for a topic that does not exist (one admin connection; never
        auto-creates a topic)."""
        from aiokafka.admin import AIOKafkaAdminClient

        from loopwarden.engine.security import client_options

        admin = AIOKafkaAdminClient(**client_options(self.config), request_timeout_ms=30_000)
        await admin.start()
        try:
            existing = set(await admin.list_topics())
            present = [t for t in topics if t in existing]
            found: dict[str, set[int]] = {t: set() for t in topics}
            for t in await admin.describe_topics(present) if present else []:
                if t.get("error_code", 0) == 0 and t.get("topic") in found:
                    found[t["topic"]] = {p["partition"] for p in t["partitions"]}
            return found
        finally:
            await admin.close()

    async def _assign(self, consumer, assigned: dict[str, set[int]], TopicPartition) -> None:
        """Read every partition of agent.health and agent.actions: at start, and partitions added later (from
        their start). The actions topic may not exist yet (no worker published an action): it is read once it does."""
        fresh = []
        partitions = await self._partitions(list(assigned))
        for topic, have in assigned.items():
            found = partitions[topic]
            new = sorted(found - have)
            if not new:
                if not found and topic == self.config.health_topic:
                    log.warning("topic %s has no partitions yet (not created?): waiting", topic)
                continue
            fresh.append((topic, new, bool(have)))
        if not fresh:
            return
        kept = {TopicPartition(topic, p): await consumer.position(TopicPartition(topic, p))
                for topic, have in assigned.items() for p in have}
        added = [(TopicPartition(topic, p), later) for topic, new, later in fresh for p in new]
        consumer.assign([*kept, *(tp for tp, _ in added)])
        for tp, position in kept.items():
            consumer.seek(tp, position)
        later = [tp for tp, was_read in added if was_read]
        first = [tp for tp, was_read in added if not was_read]
        if later:  # added while running: all of it is new
            await consumer.seek_to_beginning(*later)
        if first:
            from loopwarden.engine.recovery import seek_since  # aiokafka only once reading, as above

            await seek_since(consumer, first, now_ms() - int(self.config.board_lookback_s * 1000))
        for topic, new, _ in fresh:
            assigned[topic].update(new)
            log.info("reading %s partitions %s", topic, new)
