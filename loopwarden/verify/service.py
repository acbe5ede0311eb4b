"""``loopwarden verify``: check each declared outcome at its destination and publish a signed receipt.

Reads ``outcome_expected``, ``run_started`` (for the receipt window, and the occurrence each receipt
names: its ``run_started_ts``, docs/contract.md section 10) and ``run_ended`` from the steps topic
(read_committed). When a run's segment ends (any cause but ``approval_required``: that
run is not done), each of its expectations not yet answered is checked by the checker that accepts
it, under a semaphore (``max_concurrency``) and a per-check timeout:

* the destination answered "there, as expected" → a signed ``outcome_receipt`` with ``verified: true``;
* it answered "absent or wrong" → asked again with backoff for ``retry_negative_s`` (within the
  run's receipt window), then a signed receipt with ``verified: false`` and the reason;
* it could not be asked (refused, unreachable, timed out) → retried with backoff until the receipt
  window ends, then counted and logged: no receipt (the run ends FALSE_COMPLETE by its window);
* the target is outside the allow-lists, or the checks do not fit → refused, counted, logged, no
  receipt, nothing fetched.

``receipt_id`` is the expectation id, so a receipt published again after a restart (the verifier
keeps no offsets; it reads back ``lookback_s`` on start) is a duplicate the processor ignores.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
import time
from collections.abc import Awaitable, Callable

from msgspec import UNSET
from prometheus_client import CollectorRegistry, Counter, Histogram

from loopwarden.codecs import (
    RECEIPT_KINDS, InvalidEvent, OutcomeExpected, OutcomeReceipt, RunEnded, RunStarted, decode_step_event, encode,
)
from loopwarden.trust import SigningKey
from loopwarden.verify.checkers import (
    BadExpectation, CannotAsk, Checker, Context, Measured, NotAllowed, choose, load_checkers,
)
from loopwarden.verify.config import VerifyConfig

log = logging.getLogger("loopwarden.verify")

CHECK_OUTCOMES = ("verified", "rejected", "retried", "refused", "bad_expectation", "unsupported", "cannot_ask",
                  "error")
WEBHOOK_OUTCOMES = ("accepted", "bad_signature", "unknown_provider", "invalid")
# A receipt is published this long before the window closes at the latest when asking again.
WINDOW_MARGIN_MS = 1000


def wall_ms() -> int:
    return int(time.time() * 1000)


class VerifyMetrics:
    """The verifier's own series (its /metrics); labels from bounded sets, never run ids or targets."""

    def __init__(self, checker_names: tuple[str, ...], registry: CollectorRegistry | None = None) -> None:
        r = self.registry = registry or CollectorRegistry()
        self.checks = Counter("loopwarden_verify_checks_total",
                              "Checks of declared outcomes, by checker and result (retried: asked again later).",
                              ["checker", "outcome"], registry=r)
        self.receipts = Counter("loopwarden_verify_receipts_total", "Signed receipts published, by verified.",
                                ["verified"], registry=r)
        self.gave_up = Counter("loopwarden_verify_gave_up_total",
                               "Expectations left without a receipt: the destination could not be asked within "
                               "the receipt window, or the target was refused.", ["checker", "reason"], registry=r)
        self.seconds = Histogram("loopwarden_verify_check_seconds", "One check, from start to answer.", ["checker"],
                                 buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30), registry=r)
        self.webhooks = Counter("loopwarden_verify_webhooks_total", "Provider webhook deliveries, by result.",
                                ["outcome"], registry=r)
        self.events = Counter("loopwarden_verify_events_total", "Steps-topic events read, by what they were.",
                              ["type"], registry=r)
        for name in (*checker_names, "none"):
            for o in CHECK_OUTCOMES:
                self.checks.labels(name, o)
            self.seconds.labels(name)
        for v in ("true", "false"):
            self.receipts.labels(v)
        for o in WEBHOOK_OUTCOMES:
            self.webhooks.labels(o)

    def reason_label(self, reason: str) -> str:
        return reason if len(reason) <= 40 and reason.replace("_", "").isalnum() else "other"


class Verifier:
    """The verifier's core: events in, checks scheduled, signed receipts out through ``publish``."""

    def __init__(self, config: VerifyConfig, key: SigningKey, publish: Callable[[OutcomeReceipt], Awaitable[None]],
                 checkers: dict[str, Checker] | None = None, metrics: VerifyMetrics | None = None,
                 now_ms: Callable[[], int] = wall_ms, http_session=None) -> None:
        self.config = config
        self.key = key
        self.publish = publish
        self.checkers = checkers if checkers is not None else load_checkers()
        self.metrics = metrics or VerifyMetrics(tuple(self.checkers))
        self.now_ms = now_ms
        self.ctx = Context(config=config, timeout_s=config.check_timeout_s, max_body_bytes=config.max_body_bytes,
                           http_session=http_session)
        self.sem = asyncio.Semaphore(config.max_concurrency)
        self.expected: dict[str, dict[str, OutcomeExpected]] = {}  # run id -> expectation id -> expectation
        self.window_ms: dict[str, int] = {}  # run id -> its policy's receipt window
        # run id -> ts of its latest run_started: the occurrence a receipt signs (run_started_ts)
        self.run_started_ts: dict[str, int] = {}
        self.ended_ts: dict[str, int] = {}  # run id -> ts of its last segment end that asks for a check
        self.started: set[tuple[str, str]] = set()  # (run id, expectation id) checked or being checked
        self.tasks: set[asyncio.Task] = set()
        self.seen_ms: dict[str, int] = {}  # run id -> last event's ts (to forget runs)

    # -- events ----------------------------------------------------------------------------------
    def on_bytes(self, value: bytes | None, content_type: str | None = None) -> None:
        """A raw steps-topic message: decoded here; anything invalid is counted and skipped (the
        processor dead-letters it)."""
        try:
            ev = decode_step_event(value or b"", content_type)
        except InvalidEvent:
            self.metrics.events.labels("invalid").inc()
            return
        self.on_event(ev)

    def on_event(self, ev) -> None:
        run_id = ev.run_id
        if isinstance(ev, OutcomeExpected):
            self.metrics.events.labels("outcome_expected").inc()
            self.expected.setdefault(run_id, {}).setdefault(ev.expectation_id, ev)
            self.seen_ms[run_id] = max(self.seen_ms.get(run_id, 0), ev.ts)
            if run_id in self.ended_ts:  # declared after the segment ended: check now
                self._schedule(run_id)
        elif isinstance(ev, RunStarted):
            self.window_ms[run_id] = int(ev.policy.receipt_window_s * 1000)
            self.run_started_ts[run_id] = ev.ts
        elif isinstance(ev, RunEnded):
            self.metrics.events.labels("run_ended").inc()
            self.seen_ms[run_id] = max(self.seen_ms.get(run_id, 0), ev.ts)
            if ev.cause != "approval_required":
                self.ended_ts[run_id] = ev.ts
                self._schedule(run_id)

    def _schedule(self, run_id: str) -> None:
        end_ts = self.ended_ts[run_id]
        window = self.window_ms.get(run_id, int(self.config.default_receipt_window_s * 1000))
        for exp_id, exp in self.expected.get(run_id, {}).items():
            if (run_id, exp_id) in self.started:
                continue
            self.started.add((run_id, exp_id))
            task = asyncio.get_running_loop().create_task(self.verify_one(exp, end_ts + window))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    def forget_before(self, ts_ms: int) -> int:
        """Drop runs whose last event is older than ``ts_ms`` (bounded memory); returns how many."""
        old = [r for r, ts in self.seen_ms.items() if ts < ts_ms]
        for r in old:
            for exp_id in self.expected.pop(r, {}):
                self.started.discard((r, exp_id))
            self.seen_ms.pop(r, None)
            self.window_ms.pop(r, None)
            self.run_started_ts.pop(r, None)
            self.ended_ts.pop(r, None)
        return len(old)

    async def idle(self) -> None:
        """Wait until every scheduled check has finished (tests, shutdown)."""
        while self.tasks:
            await asyncio.gather(*list(self.tasks), return_exceptions=True)

    # -- one expectation -------------------------------------------------------------------------
    async def _check_once(self, checker: Checker, exp: OutcomeExpected) -> Measured:
        start = time.monotonic()
        try:
            async with self.sem:
                # A checker's own timeouts come first; this one bounds any checker, plug-ins included.
                return await asyncio.wait_for(checker.check(exp, self.ctx), self.config.check_timeout_s + 1)
        except asyncio.TimeoutError:
            raise CannotAsk("timeout", f"no answer within {self.config.check_timeout_s} s") from None
        finally:
            self.metrics.seconds.labels(checker.name).observe(time.monotonic() - start)

    async def verify_one(self, exp: OutcomeExpected, window_deadline_ms: int) -> OutcomeReceipt | None:
        """Check one expectation until it has an answer or its time is up; returns the receipt published."""
        m, where = self.metrics, f"run {exp.run_id!r} expectation {exp.expectation_id!r}"
        checker = choose(self.checkers, exp)
        if checker is None:
            m.checks.labels("none", "unsupported").inc()
            m.gave_up.labels("none", "unsupported").inc()
            log.warning("%s: no checker for target %r (scheme not supported): no receipt", where, exp.target[:100])
            return None
        name = checker.name
        negative_until = min(window_deadline_ms - WINDOW_MARGIN_MS, self.now_ms() + int(self.config.retry_negative_s * 1000))
        delay = self.config.retry_initial_s
        while True:
            try:
                result = await self._check_once(checker, exp)
            except NotAllowed as exc:
                m.checks.labels(name, "refused").inc()
                m.gave_up.labels(name, m.reason_label(exc.reason)).inc()
                log.warning("%s refused, not fetched (%s): %s", where, exc.reason, exc)
                return None
            except BadExpectation as exc:
                m.checks.labels(name, "bad_expectation").inc()
                m.gave_up.labels(name, m.reason_label(exc.reason)).inc()
                log.warning("%s cannot be checked (%s): %s", where, exc.reason, exc)
                return None
            except CannotAsk as exc:
                m.checks.labels(name, "cannot_ask").inc()
                # could not be asked: keep trying while the receipt window is open
                if self.now_ms() + delay * 1000 > window_deadline_ms - WINDOW_MARGIN_MS:
                    m.gave_up.labels(name, m.reason_label(exc.reason)).inc()
                    log.warning("%s: destination could not be asked within the receipt window (%s): %s; no receipt",
                                where, exc.reason, exc)
                    return None
                log.info("%s: cannot ask yet (%s): %s; again in %.1f s", where, exc.reason, exc, delay)
            except Exception as exc:  # a checker's bug (a plug-in's included) must not stop the verifier
                m.checks.labels(name, "error").inc()
                m.gave_up.labels(name, "error").inc()
                log.exception("%s: checker %r failed: %s; no receipt", where, name, exc)
                return None
            else:
                if result.verified or self.now_ms() + delay * 1000 > negative_until:
                    m.checks.labels(name, "verified" if result.verified else "rejected").inc()
                    return await self._publish(exp, result)
                m.checks.labels(name, "retried").inc()
            await asyncio.sleep(delay)
            delay = min(delay * 2, self.config.retry_max_s)

    async def _publish(self, exp: OutcomeExpected, result: Measured) -> OutcomeReceipt:
        evidence = {k: v for k, v in result.receipt_evidence().items() if v is not None}
        evidence["checker_target"] = hashlib.sha256(exp.target.encode()).hexdigest()[:16]
        # Bound to the occurrence it checked; a run whose run_started was not read (before the lookback)
        # gets an unbound receipt, which the processor judges by its ts.
        receipt = self.key.sign(OutcomeReceipt(
            run_id=exp.run_id, ts=self.now_ms(), receipt_id=exp.expectation_id, kind=exp.kind,
            verifier="destination", verified=result.verified, evidence=evidence,
            run_started_ts=self.run_started_ts.get(exp.run_id, UNSET)))
        await self.publish(receipt)
        self.metrics.receipts.labels("true" if result.verified else "false").inc()
        log.info("run %r expectation %r: verified=%s %s", exp.run_id, exp.expectation_id, result.verified,
                 result.reason or "")
        return receipt

    # -- provider webhooks -----------------------------------------------------------------------
    async def on_webhook(self, provider: str, body: bytes, signature: str | None) -> tuple[int, str]:
        """A provider's delivery report (HMAC-SHA256 of the body with the provider's secret, hex, in
        ``X-Loopwarden-Signature: sha256=…``) becomes a signed receipt for the run it names."""
        import os

        m = self.metrics.webhooks
        env = self.config.webhook_secrets.get(provider)
        secret = os.environ.get(env or "", "") if env else ""
        if not secret:
            m.labels("unknown_provider").inc()
            return 404, f"no webhook secret configured for provider {provider[:50]!r}"
        want = "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
        if signature is None or not hmac.compare_digest(want, signature.strip()):
            m.labels("bad_signature").inc()
            log.warning("webhook %r: bad or missing X-Loopwarden-Signature; ignored", provider)
            return 401, "bad signature"
        try:
            doc = json.loads(body)
            kind = doc.get("kind", "message")
            evidence = {k: v for k, v in (doc.get("evidence") or {}).items()
                        if isinstance(v, (str, int, float, bool)) and not isinstance(v, dict)}
            evidence["provider"] = provider[:100]
            if kind not in RECEIPT_KINDS or not isinstance(doc["delivered"], bool):
                raise ValueError(f"kind {kind!r} / delivered {doc.get('delivered')!r}")
            receipt = self.key.sign(OutcomeReceipt(
                run_id=str(doc["run_id"]), ts=self.now_ms(), receipt_id=str(doc["receipt_id"]), kind=kind,
                verifier="destination", verified=doc["delivered"], evidence=evidence))
            # Through the wire codec, so a receipt the processor would refuse is refused here.
            from loopwarden.codecs import decode_outcome_event

            decode_outcome_event(encode(receipt))
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            m.labels("invalid").inc()
            return 400, f"invalid delivery report: {exc}"[:300]
        await self.publish(receipt)
        m.labels("accepted").inc()
        self.metrics.receipts.labels("true" if receipt.verified else "false").inc()
        return 202, receipt.receipt_id


# -- the service on Kafka ----------------------------------------------------------------------------
async def serve_http(verifier: Verifier, host: str, port: int):
    """/metrics, /healthz and the webhook intake ``POST /webhooks/{provider}``; returns the aiohttp runner."""
    from aiohttp import web
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

    async def metrics(request):
        return web.Response(body=generate_latest(verifier.metrics.registry), headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def healthz(request):
        return web.json_response({"status": "ok", "checks_in_flight": len(verifier.tasks)})

    async def webhook(request):
        body = await request.content.read(64 * 1024 + 1)
        if len(body) > 64 * 1024:
            verifier.metrics.webhooks.labels("invalid").inc()
            return web.Response(status=413, text="delivery report larger than 64 KiB")
        status, text = await verifier.on_webhook(request.match_info["provider"], body,
                                                 request.headers.get("X-Loopwarden-Signature"))
        return web.Response(status=status, text=text)

    app = web.Application(client_max_size=64 * 1024 + 1)
    app.add_routes([web.get("/metrics", metrics), web.get("/healthz", healthz),
                    web.post("/webhooks/{provider}", webhook)])
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    return runner


def kafka_options(config: VerifyConfig) -> dict:
    """aiokafka's connection arguments: the config's broker, and TLS/SASL from the LOOPWARDEN_* settings every
    command reads (LOOPWARDEN_SECURITY_PROTOCOL, LOOPWARDEN_SASL_*, LOOPWARDEN_SSL_*): with ACLs, the verifier
    connects as its own principal, the one allowed to write the trusted receipts topic."""
    from loopwarden.config import from_env
    from loopwarden.engine.security import client_options

    return client_options(from_env({"broker": config.broker}))


async def _wait_for_topic(options: dict, topic: str, stop: asyncio.Event) -> bool:
    """Until ``topic`` exists (True) or ``stop`` is set (False): subscribing to a missing topic lets a broker
    with auto.create.topics.enable create it with its default count (1 partition, not the worker's), so the
    verifier waits for a worker to make it."""
    from aiokafka.admin import AIOKafkaAdminClient

    admin = AIOKafkaAdminClient(**options)
    await admin.start()
    try:
        waiting = False
        while not stop.is_set() and topic not in set(await admin.list_topics()):
            if not waiting:
                log.warning("waiting for topic %s to exist (a worker creates it)", topic)
                waiting = True
            await asyncio.sleep(1)
        return not stop.is_set()
    finally:
        await admin.close()


async def run(config: VerifyConfig, key: SigningKey, stop: asyncio.Event | None = None) -> None:
    """Consume the steps topic (read_committed), check, publish signed receipts, until ``stop`` is set."""
    import aiohttp
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRebalanceListener

    from loopwarden.engine.recovery import seek_since
    from loopwarden.verify.checkers.http import ssl_context

    stop = stop or asyncio.Event()
    options = kafka_options(config)

    async def publish(receipt: OutcomeReceipt) -> None:
        delay = 0.2
        for attempt in range(6):
            try:
                await producer.send_and_wait(config.receipts_topic, encode(receipt), key=receipt.run_id.encode())
                return
            except Exception as exc:  # the broker may be restarting: a few tries, then say so
                if attempt == 5:
                    log.error("receipt %r of run %r not published: %s", receipt.receipt_id, receipt.run_id, exc)
                    raise
                await asyncio.sleep(delay)
                delay *= 2

    session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ssl_context(config.http_cafile),
                                                                   limit=config.max_concurrency))
    verifier = Verifier(config, key, publish, http_session=session)
    try:  # its port first, as the worker and the board: a port in use stops it before it reaches for Kafka
        web_runner = await serve_http(verifier, config.web_host, config.web_port)
    except BaseException:
        await session.close()
        raise
    producer = AIOKafkaProducer(**options, acks="all", enable_idempotence=True, linger_ms=5)
    try:
        await producer.start()
    except BaseException:
        await producer.stop()
        await session.close()
        await web_runner.cleanup()
        raise

    consumer = AIOKafkaConsumer(**options, group_id=config.group_id,
                                isolation_level="read_committed", enable_auto_commit=False,
                                auto_offset_reset="earliest")

    class Rewind(ConsumerRebalanceListener):
        """No committed offsets: each assigned partition is read back ``lookback_s`` (receipt ids make
        repeats duplicates the processor ignores)."""

        async def on_partitions_revoked(self, revoked) -> None:
            pass

        async def on_partitions_assigned(self, assigned) -> None:
            await seek_since(consumer, assigned, wall_ms() - int(config.lookback_s * 1000))

    try:
        exists = await _wait_for_topic(options, config.steps_topic, stop)
    except BaseException:
        exists = None
        raise
    finally:
        if not exists:  # failed, or stopped while waiting
            await producer.stop()
            await session.close()
            await web_runner.cleanup()
    if not exists:
        return
    consumer.subscribe([config.steps_topic], listener=Rewind())
    await consumer.start()
    log.info("verify: reading %s, receipts to %s, signing as %r", config.steps_topic, config.receipts_topic, key.key_id)
    try:
        swept = time.monotonic()
        while not stop.is_set():
            batch = await consumer.getmany(timeout_ms=200, max_records=5000)
            for records in batch.values():
                for rec in records:
                    ctype = next((v.decode() for k, v in rec.headers or () if k.lower() == "content-type"), None)
                    verifier.on_bytes(rec.value, ctype)
            if time.monotonic() - swept > 60:
                swept = time.monotonic()
                verifier.forget_before(wall_ms() - int(config.lookback_s * 1000))
    finally:
        for task in list(verifier.tasks):
            task.cancel()
        await asyncio.gather(*verifier.tasks, return_exceptions=True)
        await consumer.stop()
        await producer.stop()
        await session.close()
        await web_runner.cleanup()
