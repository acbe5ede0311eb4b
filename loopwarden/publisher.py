"""A minimal publisher for Python agents and destinations: loopwarden's Structs, sent with aiokafka.

Same topics and keys as the TypeScript emitter: input events on ``agent.steps``,
receipts on ``agent.outcomes``, keyed by run_id, JSON (or MessagePack with the
``content-type: application/msgpack`` header)::

    async with Publisher("127.0.0.1:9092") as pub:
        await pub.publish(RunStarted(run_id="r1", ts=now_ms(), agent="a", policy=Policy(version="v1")))
"""

from __future__ import annotations

import asyncio
import time

from aiokafka import AIOKafkaProducer

from loopwarden.codecs import JSON, MSGPACK, InputEvent, OutcomeExpected, OutcomeReceipt, ReceiptKind, encode


class PublishError(RuntimeError):
    """Some events were not acknowledged by Kafka."""


def now_ms() -> int:
    return int(time.time() * 1000)


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

    async def partitions(self, topic: str) -> set[int]:
        return set(await self._producer.partitions_for(topic))
