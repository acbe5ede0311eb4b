"""A minimal publisher for Python agents and destinations: loopwarden's Structs, sent with aiokafka.

Same topics and keys as the TypeScript emitter: input events on ``agent.steps``,
receipts on ``agent.outcomes``, keyed by run_id, JSON (or MessagePack with the
``content-type: application/msgpack`` header)::

    async with Publisher("127.0.0.1:9092") as pub:
        await pub.publish(RunStarted(run_id="r1", ts=now_ms(), agent="a", policy=Policy(version="v1")))

A ``recovery_action`` read from ``agent.actions`` starts the job's next attempt with
:func:`next_attempt` (docs/actions.md)::

    await pub.publish(next_attempt(action, run_id="r1-2", agent="a", policy=policy))
"""

from __future__ import annotations

import asyncio
import time

import msgspec
from aiokafka import AIOKafkaProducer

from loopwarden.codecs import (
    JSON, MSGPACK, InputEvent, OutcomeExpected, OutcomeReceipt, Policy, ReceiptKind, RunStarted, encode,
)
from loopwarden.codecs.events import RecoveryAction


class PublishError(RuntimeError):
    """Some events were not acknowledged by Kafka."""


def now_ms() -> int:
    return int(time.time() * 1000)


def next_attempt(action: RecoveryAction, run_id: str, agent: str, policy: Policy,
                 ts: int | None = None) -> RunStarted:
    """The ``run_started`` of the attempt a ``resume`` or ``restart`` calls for: a new run linked to the job.

    ``policy`` is the one the job ran under; the action's ``next_policy`` replaces it when set (a tighter
    bound, say), keeping ``policy``'s recovery when ``next_policy`` declares none, so the job's bound holds
    across its attempts. Raises ValueError for an action that starts nothing (reverify, escalate, a
    person's abandon or acknowledge) and for a run id that is not new.
    """
    if action.next_attempt is None:
        raise ValueError(f"action {action.action_id!r} is {action.action!r}: it starts no attempt "
                         "(only resume and restart do)")
    if run_id in (action.run_id, action.job_id):
        raise ValueError(f"run_id {run_id!r} names an earlier attempt of job {action.job_id!r}: "
                         "each attempt is a run with its own id")
    chosen = policy
    if action.next_policy is not None:
        chosen = action.next_policy
        if chosen.recovery is msgspec.UNSET and policy.recovery is not msgspec.UNSET:
            chosen = msgspec.structs.replace(chosen, recovery=policy.recovery)
    return RunStarted(run_id=run_id, ts=now_ms() if ts is None else ts, agent=agent, policy=chosen,
                      job_id=action.job_id, attempt=action.next_attempt, recovers=action.run_id)


class Publisher:
    def __init__(
        self,
        bootstrap: str,
        steps_topic: str = "agent.steps",
        outcomes_topic: str = "agent.outcomes",
        content_type: str = JSON,
        linger_ms: int = 5,
        options: dict | None = None,
    ) -> None:
        """``options``: aiokafka client settings (TLS, SASL: ``loopwarden.engine.security.client_options``);
        they name the brokers too when given."""
        if content_type not in (JSON, MSGPACK):
            raise ValueError(f"content_type: {content_type!r} must be {JSON!r} or {MSGPACK!r}")
        self.steps_topic, self.outcomes_topic, self.content_type = steps_topic, outcomes_topic, content_type
        # Idempotence: a retried send is not written twice.
        connect = options if options is not None else {"bootstrap_servers": bootstrap}
        self._producer = AIOKafkaProducer(**connect, acks="all", enable_idempotence=True, linger_ms=linger_ms)
        self.sent = 0
        self._pending: set = set()
        self.failed = 0

    async def start(self) -> "Publisher":
        try:
            await self._producer.start()
        except BaseException:
            await self._producer.stop()  # nothing left open (else: "Unclosed AIOKafkaProducer")
            raise
        return self

    async def stop(self) -> None:
        try:
            await self.flush()
        finally:
            await self._producer.stop()

    async def __aenter__(self) -> "Publisher":
        return await self.start()

    async def __aexit__(self, *exc) -> None:
        await self.stop()

    def topic_for(self, event: InputEvent) -> str:
        return self.outcomes_topic if isinstance(event, OutcomeReceipt) else self.steps_topic

    async def publish(self, event: InputEvent, wait: bool = False) -> None:
        """Send one event keyed by its run_id; ``wait`` blocks until the broker acked it."""
        headers = [("content-type", MSGPACK.encode())] if self.content_type == MSGPACK else None
        await self.publish_raw(self.topic_for(event), event.run_id.encode(), encode(event, self.content_type),
                               headers=headers, wait=wait)

    async def publish_raw(self, topic: str, key: bytes | None, value: bytes, headers=None, wait: bool = False,
                          partition: int | None = None) -> None:
        fut = await self._producer.send(topic, value=value, key=key, headers=headers, partition=partition)
        self.sent += 1
        if wait:
            await fut
        else:
            self._pending.add(fut)
            fut.add_done_callback(self._pending.discard)

    async def flush(self) -> None:
        """Wait until every event sent so far is acked; raise if any was not (never lose one silently)."""
        pending = list(self._pending)
        await self._producer.flush()
        results = await asyncio.gather(*pending, return_exceptions=True)
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            self.failed += len(errors)
            raise PublishError(f"{len(errors)} of {len(pending)} events were not acked by Kafka: {errors[0]!r}") from errors[0]

    async def expect_outcome(self, run_id: str, expectation_id: str, kind: ReceiptKind, target: str,
                             checks: dict | None = None, ts: int | None = None, wait: bool = False) -> OutcomeExpected:
        """Declare what the run must produce (docs/contract.md section 10), for ``loopwarden verify`` to check.

        The application says it, never the model: e.g. ``expect_outcome(run_id, "invoice-pdf", "file",
        "file:///srv/out/inv-7.pdf", {"min_size": 1000, "content_type": "application/pdf"})``.
        """
        event = OutcomeExpected(run_id=run_id, ts=now_ms() if ts is None else ts, expectation_id=expectation_id,
                                kind=kind, target=target, checks=checks or {})
        await self.publish(event, wait=wait)
        return event

    async def publish_receipt(self, receipt: OutcomeReceipt, key=None, wait: bool = False) -> OutcomeReceipt:
        """Publish a receipt, signed first with ``key`` (a ``loopwarden.trust.SigningKey``) when given."""
        if key is not None:
            receipt = key.sign(receipt)
        await self.publish(receipt, wait=wait)
        return receipt

    async def start_attempt(self, action: RecoveryAction, run_id: str, agent: str, policy: Policy,
                            wait: bool = False) -> RunStarted:
        """Publish the ``run_started`` of the attempt ``action`` calls for (:func:`next_attempt`)."""
        event = next_attempt(action, run_id, agent, policy)
        await self.publish(event, wait=wait)
        return event

    async def partitions(self, topic: str) -> set[int]:
        return set(await self._producer.partitions_for(topic))
