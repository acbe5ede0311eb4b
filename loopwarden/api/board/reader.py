"""The board's reader of agent.health: every partition, committed records only, into a :class:`Fleet`.

It joins no consumer group (the fleet view needs all partitions, whoever processes
them), starts ``board_lookback_s`` back, picks up partitions added later, ages settled
runs out every few seconds, and wakes the server's streams when the fleet changed.
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
        self.config = config
        self.fleet = Fleet(settled_ms=int(config.board_settled_s * 1000), max_runs=config.board_max_runs)
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

    # -- reading agent.health -------------------------------------------------------------
    async def consume(self) -> None:
        """Read every partition of agent.health (committed only) from board_lookback_s ago, for ever."""
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
            raise
        from loopwarden.commands.cliutil import _connected

        _connected()  # aiokafka's own lines pass from now on
        try:
            assigned: set[int] = set()
            checked = 0.0
            expired = time.monotonic()
            while not self.stopping.is_set():
                if time.monotonic() - checked > PARTITIONS_CHECK_S or not assigned:
                    checked = time.monotonic()
                    await self._assign(consumer, assigned, TopicPartition)
                batch = await consumer.getmany(timeout_ms=200, max_records=5000) if assigned else {}
                if not assigned:
                    await asyncio.sleep(1)
                now = now_ms()
                n = 0
                for records in batch.values():
                    for rec in records:
                        if rec.value is not None:
                            self.fleet.add(rec.value, now)
                            n += 1
                self.consumed += n
                if time.monotonic() - expired > EXPIRE_EVERY_S:
                    expired = time.monotonic()
                    if self.fleet.expire(now):
                        n += 1
                if n:
                    self.notify()
                if not self.ready and assigned and not batch:
                    self.ready = True
                    log.info("caught up with %s: %d runs on the board", c.health_topic, len(self.fleet.runs))
        finally:
            await consumer.stop()

    async def _partitions(self, topic: str) -> set[int]:
        """The topic's partitions now (an admin request: never auto-creates the topic)."""
        from aiokafka.admin import AIOKafkaAdminClient

        from loopwarden.engine.security import client_options

        admin = AIOKafkaAdminClient(**client_options(self.config), request_timeout_ms=30_000)
        await admin.start()
        try:
            if topic not in set(await admin.list_topics()):
                return set()
            described = await admin.describe_topics([topic])
            return {p["partition"] for t in described if t.get("error_code", 0) == 0 for p in t["partitions"]}
        finally:
            await admin.close()

    async def _assign(self, consumer, assigned: set[int], TopicPartition) -> None:
        """Read every partition of agent.health: at start, and partitions added later (from their start)."""
        topic = self.config.health_topic
        found = await self._partitions(topic)
        new = sorted(set(found) - assigned)
        if not new:
            if not found:
                log.warning("topic %s has no partitions yet (not created?): waiting", topic)
            return
        kept = {TopicPartition(topic, p): await consumer.position(TopicPartition(topic, p)) for p in assigned}
        fresh = [TopicPartition(topic, p) for p in new]
        consumer.assign([*kept, *fresh])
        for tp, position in kept.items():
            consumer.seek(tp, position)
        if assigned:  # added while running: all of it is new
            await consumer.seek_to_beginning(*fresh)
        else:
            from loopwarden.engine.recovery import seek_since  # aiokafka only once reading, as above

            await seek_since(consumer, fresh, now_ms() - int(self.config.board_lookback_s * 1000))
        assigned.update(new)
        log.info("reading %s partitions %s", topic, new)
