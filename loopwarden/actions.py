"""``loopwarden actions``: deliver each recovery action on ``agent.actions`` to the fleet's own controller.

One HTTPS POST per action, its JSON body signed with HMAC-SHA256 (docs/actions.md says how to verify it).
Delivery is at least once: a partition's offset is committed only past actions the receiver answered 2xx,
so a crash, a rebalance or a receiver that is down loses none; what is repeated keeps its ``action_id``.
An action waits until its ``not_before_ts``; actions wait side by side (each its own task), so one
action's backoff never holds back another's delivery, only the commit of offsets after it.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import random
import ssl
import time
from collections import OrderedDict, deque
from dataclasses import dataclass

import msgspec
from prometheus_client import CollectorRegistry, Counter, Gauge

from loopwarden.codecs import encode
from loopwarden.codecs.events import RecoveryAction

log = logging.getLogger("loopwarden.actions")

SIGNATURE_HEADER = "X-Loopwarden-Signature"
ACTION_ID_HEADER = "X-Loopwarden-Action-Id"
_decode_action = msgspec.json.Decoder(RecoveryAction).decode
# Action ids remembered as delivered, so a repeat on the topic is not posted again by this process.
REMEMBERED_IDS = 100_000


def signature(secret: bytes, body: bytes) -> str:
    """The signature header's value: ``sha256=`` and the hex HMAC-SHA256 of the body under the secret."""
    return "sha256=" + hmac.new(secret, body, hashlib.sha256).hexdigest()


def verify(secret: bytes, body: bytes, header: str | None) -> bool:
    """What a receiver checks (docs/actions.md): the header is the body's signature, compared in constant time."""
    return header is not None and hmac.compare_digest(signature(secret, body), header)


def escalation_class(action: RecoveryAction) -> str:
    """The bounded class of an escalation's reason, for a metric label and an alert per class.

    ``attempts_exhausted``, ``not_idempotent`` (FAILED over a tool whose repetition is not safe),
    ``producer_dropped``, ``uncertain`` (the safety rules'), ``person`` (decided by a person), else
    ``policy`` (the policy names escalate for the state).
    """
    reason = action.reason
    if action.decided_by.startswith("person:"):
        return "person"
    if reason == "attempts_exhausted":
        return "attempts_exhausted"
    if reason == "FAILED:not_idempotent":
        return "not_idempotent"
    if reason.endswith(":producer_dropped"):
        return "producer_dropped"
    if reason.startswith("UNCERTAIN:"):
        return "uncertain"
    return "policy"


class ActionMetrics:
    """The deliverer's series, on its own registry (served at /metrics)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.delivered = Counter("loopwarden_actions_delivered_total", "Actions the webhook answered 2xx, by action",
                                 ["action"], registry=r)
        self.escalations = Counter("loopwarden_actions_escalations_total",
                                   "Escalations delivered, by reason class and the policy's escalate_to ('' when none)",
                                   ["reason", "escalate_to"], registry=r)
        self.failures = Counter("loopwarden_actions_delivery_failures_total",
                                "Delivery attempts that failed and will be retried, by why (status_5xx, status_4xx, "
                                "connection, timeout)", ["why"], registry=r)
        self.repeats = Counter("loopwarden_actions_repeats_total",
                               "Actions read again after this process delivered them (not posted again)", registry=r)
        self.invalid = Counter("loopwarden_actions_invalid_total",
                               "Records on the actions topic that are not a recovery_action (logged, skipped)",
                               registry=r)
        self.pending = Gauge("loopwarden_actions_pending", "Actions read and not yet delivered (waiting or retrying)",
                             registry=r)
        for why in ("status_5xx", "status_4xx", "connection", "timeout"):
            self.failures.labels(why)


@dataclass(frozen=True)
class Settings:
    webhook: str
    secret: bytes | None
    ssl: ssl.SSLContext
    topic: str = "agent.actions"
    group: str = "loopwarden-actions"
    timeout_s: float = 10.0
    first_backoff_s: float = 0.5
    max_backoff_s: float = 60.0
    concurrency: int = 16
    max_pending: int = 10_000


class _Offsets:
    """One partition's read offsets in order, and which were delivered: commit up to the first that was not."""

    def __init__(self) -> None:
        self.order: deque[int] = deque()
        self.done: set[int] = set()
        self.position: int | None = None  # the next offset to read once every action before it was delivered
        self.committed: int | None = None  # what the group has, as far as this process knows

    def add(self, offset: int) -> None:
        self.order.append(offset)

    def committable(self) -> int | None:
        """The offset to commit (the next to read), while the group does not have it yet."""
        while self.order and self.order[0] in self.done:
            last = self.order.popleft()
            self.done.discard(last)
            self.position = last + 1
        return self.position if self.position != self.committed else None


class Deliverer:
    """Consumes the actions topic and posts each action; ``run`` until ``stop`` is set."""

    def __init__(self, settings: Settings, kafka: dict, metrics: ActionMetrics | None = None) -> None:
        self.settings, self.kafka = settings, kafka
        self.metrics = metrics or ActionMetrics()
        self.partitions: dict = {}  # TopicPartition -> _Offsets
        self.tasks: dict = {}  # TopicPartition -> set of delivery tasks
        self.delivered_ids: OrderedDict[str, None] = OrderedDict()
        self.in_flight: set[str] = set()
        self._limit = asyncio.Semaphore(settings.concurrency)
        self._consumer = None
        self._session = None

    async def run(self, stop: asyncio.Event, started: asyncio.Event | None = None) -> None:
        import aiohttp
        from aiokafka import AIOKafkaConsumer
        from aiokafka.abc import ConsumerRebalanceListener

        deliverer = self

        class Listener(ConsumerRebalanceListener):
            async def on_partitions_revoked(self, revoked) -> None:
                await deliverer._release(revoked)

            async def on_partitions_assigned(self, assigned) -> None:
                pass

        consumer = self._consumer = AIOKafkaConsumer(
            **self.kafka, group_id=self.settings.group, enable_auto_commit=False, auto_offset_reset="earliest",
            isolation_level="read_committed")
        consumer.subscribe([self.settings.topic], listener=Listener())
        timeout = aiohttp.ClientTimeout(total=self.settings.timeout_s)
        self._session = aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(ssl=self.settings.ssl))
        try:
            await consumer.start()
            if started is not None:
                started.set()
            while not stop.is_set():
                pending = sum(len(t) for t in self.tasks.values())
                assigned = consumer.assignment()
                if pending >= self.settings.max_pending:
                    consumer.pause(*assigned)  # read no further ahead; polling keeps the group membership
                elif consumer.paused():
                    consumer.resume(*consumer.paused())
                batch = await consumer.getmany(timeout_ms=200, max_records=1000)
                for tp, records in batch.items():
                    for record in records:
                        self._accept(tp, record.offset, record.value)
                await self._commit()
            await self._release(list(self.partitions))
        finally:
            await consumer.stop()
            await self._session.close()

    def _accept(self, tp, offset: int, value: bytes | None) -> None:
        offsets = self.partitions.setdefault(tp, _Offsets())
        offsets.add(offset)
        try:
            action = _decode_action(value or b"")
        except (msgspec.ValidationError, msgspec.DecodeError) as exc:
            self.metrics.invalid.inc()
            log.warning("%s[%d] offset %d is not a recovery_action, skipped: %s", tp.topic, tp.partition, offset, exc)
            offsets.done.add(offset)
            return
        if action.action_id in self.delivered_ids or action.action_id in self.in_flight:
            self.metrics.repeats.inc()
            offsets.done.add(offset)
            return
        self.in_flight.add(action.action_id)
        self.metrics.pending.inc()
        task = asyncio.ensure_future(self._deliver(tp, offset, action))
        self.tasks.setdefault(tp, set()).add(task)
        task.add_done_callback(self.tasks[tp].discard)
        task.add_done_callback(self._failed)

        def settled(_: asyncio.Future, action_id: str = action.action_id) -> None:
            # here, not in a `finally` of the coroutine: a task cancelled before it first ran never enters it
            self.in_flight.discard(action_id)
            self.metrics.pending.dec()
        task.add_done_callback(settled)

    @staticmethod
    def _failed(task: asyncio.Future) -> None:
        # Not expected (every delivery failure is retried inside): said, and the offset stays uncommitted,
        # so the action is posted again after a restart rather than lost.
        if not task.cancelled() and task.exception() is not None:
            log.error("a delivery stopped: %r; its partition commits no further until a restart", task.exception())

    async def _deliver(self, tp, offset: int, action: RecoveryAction) -> None:
        wait = action.not_before_ts / 1000 - time.time()
        if wait > 0:
            await asyncio.sleep(wait)
        body = encode(action)
        headers = {"Content-Type": "application/json", ACTION_ID_HEADER: action.action_id}
        if self.settings.secret is not None:
            headers[SIGNATURE_HEADER] = signature(self.settings.secret, body)
        backoff, failures = self.settings.first_backoff_s, 0
        while True:
            async with self._limit:
                why = await self._post(body, headers)
            if why is None:
                break
            failures += 1
            self.metrics.failures.labels(why).inc()
            if failures == 1 or failures % 10 == 0:
                log.warning("action %s: delivery failed (%s, %d time(s)); retrying with backoff",
                            action.action_id, why, failures)
            await asyncio.sleep(backoff * random.uniform(0.5, 1.0))  # jitter: a fleet's retries do not align
            backoff = min(backoff * 2, self.settings.max_backoff_s)
        if failures:
            log.info("action %s delivered after %d failed attempt(s)", action.action_id, failures)
        self.metrics.delivered.labels(action.action).inc()
        if action.action == "escalate":
            self.metrics.escalations.labels(escalation_class(action), action.escalate_to or "").inc()
        self.delivered_ids[action.action_id] = None
        if len(self.delivered_ids) > REMEMBERED_IDS:
            self.delivered_ids.popitem(last=False)
        offsets = self.partitions.get(tp)
        if offsets is not None:
            offsets.done.add(offset)

    async def _post(self, body: bytes, headers: dict) -> str | None:
        """None when the receiver took it (2xx), else why not."""
        import aiohttp

        try:
            async with self._session.post(self.settings.webhook, data=body, headers=headers) as response:
                await response.read()
                if 200 <= response.status < 300:
                    return None
                return "status_5xx" if response.status >= 500 else "status_4xx"
        except asyncio.TimeoutError:
            return "timeout"
        except (aiohttp.ClientError, OSError):
            return "connection"

    async def _commit(self, only=None) -> None:
        offsets = {tp: o.committable() for tp, o in self.partitions.items() if only is None or tp in only}
        offsets = {tp: off for tp, off in offsets.items() if off is not None}
        if not offsets:
            return
        from aiokafka.errors import KafkaError

        try:
            await self._consumer.commit(offsets)
        except KafkaError as exc:
            # e.g. the group rebalanced meanwhile: tried again with the next batch, and what a partition's next
            # owner reads from an older offset it posts again (at least once); nothing is lost by going on
            log.warning("offsets not committed (%r); their actions may be posted again", exc)
            return
        for tp, off in offsets.items():
            if tp in self.partitions:
                self.partitions[tp].committed = off

    async def _release(self, revoked) -> None:
        """Partitions leave this process: commit what was delivered, drop the rest (their new owner posts it)."""
        revoked = [tp for tp in revoked if tp in self.partitions]
        if not revoked:
            return
        try:
            await self._commit(only=set(revoked))
        finally:
            for tp in revoked:
                tasks = self.tasks.pop(tp, set())
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
                self.partitions.pop(tp, None)
