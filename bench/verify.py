"""Bench of trusted receipts: checks per second, and what signature checks cost the worker.

``python -m bench.verify [--quick]``

a. **checks/s**: ``Verifier.verify_one`` (the http checker: TLS, status, a JSON pointer, body hash)
   against a local HTTPS destination that answers each request after 50 ms, run in its own process,
   with ``max_concurrency`` checks in flight. Target >= 1,000 checks/s on 2 cores.
b. **trust cost**: the worker's fold without Kafka (``PartitionTask.fold``, batches of 2,500, as
   ``bench/core.py`` measures it) over a fleet with one signed receipt per run, CPU time
   (``time.process_time``), three variants interleaved in each round, medians over the rounds:
   no trust setting (every receipt counts); ``LOOPWARDEN_TRUSTED_VERIFIERS`` (each receipt's signature
   checked); ``LOOPWARDEN_TRUSTED_OUTCOMES_TOPIC`` (the receipts on the verifiers' own topic, trusted by
   channel: docs/receipts.md). Also the cost of one check (canonical bytes + Ed25519 verify) and of the
   canonical bytes alone. Target: ingest with trust >= 95 % of ingest without; the channel
   meets it, a per-message signature cannot (one verify costs more than a whole run's fold).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import tempfile
import time
from pathlib import Path

from bench.common import median

DELAY_S = 0.05


def _serve(cert: str, key: str, port: int, ready) -> None:
    from aiohttp import web

    from dev.destinations import server_ssl

    async def version(request):
        await asyncio.sleep(DELAY_S)
        return web.json_response({"version": "1.4.2"})

    async def main():
        app = web.Application()
        app.add_routes([web.get("/v/{n}", version)])
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port, ssl_context=server_ssl(Path(cert), Path(key)), backlog=2048).start()
        ready.set()
        await asyncio.Event().wait()

    asyncio.run(main())


def bench_checks(n: int, concurrency: int) -> dict:
    import aiohttp

    from dev.destinations import free_port, make_ca_and_server_cert
    from loopwarden.codecs import OutcomeExpected
    from loopwarden.trust import SigningKey
    from loopwarden.verify.checkers.http import ssl_context
    from loopwarden.verify.config import VerifyConfig
    from loopwarden.verify.service import Verifier

    tmp = Path(tempfile.mkdtemp(prefix="lw-bench-verify-"))
    ca, cert, key = make_ca_and_server_cert(tmp)
    port = free_port()
    ready = multiprocessing.Event()
    server = multiprocessing.Process(target=_serve, args=(str(cert), str(key), port, ready), daemon=True)
    server.start()
    ready.wait(30)
    config = VerifyConfig(http_hosts=(f"localhost:{port}",), http_cafile=str(ca), max_concurrency=concurrency,
                          check_timeout_s=30, retry_negative_s=0)
    published = []

    async def publish(r):
        published.append(r)

    async def main() -> float:
        connector = aiohttp.TCPConnector(ssl=ssl_context(str(ca)), limit=concurrency)
        async with aiohttp.ClientSession(connector=connector) as session:
            v = Verifier(config, SigningKey.generate("bench"), publish, http_session=session)
            deadline = int(time.time() * 1000) + 3_600_000
            warm = [OutcomeExpected(run_id=f"w{i}", ts=1, expectation_id="e", kind="deployment",
                                    target=f"https://localhost:{port}/v/{i}", checks={"json": {"/version": "1.4.2"}})
                    for i in range(concurrency)]
            await asyncio.gather(*(v.verify_one(e, deadline) for e in warm))  # connections open, TLS done
            exps = [OutcomeExpected(run_id=f"r{i}", ts=1, expectation_id="e", kind="deployment",
                                    target=f"https://localhost:{port}/v/{i}", checks={"json": {"/version": "1.4.2"}})
                    for i in range(n)]
            t0 = time.perf_counter()
            results = await asyncio.gather(*(v.verify_one(e, deadline) for e in exps))
            elapsed = time.perf_counter() - t0
            assert all(r is not None and r.verified for r in results), "a check failed"
            return elapsed

    try:
        elapsed = asyncio.run(main())
    finally:
        server.terminate()
    return {"checks": n, "seconds": elapsed, "per_s": n / elapsed, "concurrency": concurrency}


def _signed_fleet(runs: int):
    """The bench fleet's messages plus one receipt per run signed by a trusted key (the unsigned ones dropped)."""
    from loopwarden.codecs import OutcomeReceipt, decode_input, encode
    from loopwarden.simulate import fleet
    from loopwarden.trust import SigningKey

    key = SigningKey.generate("bench-verifier")
    out = []
    ended: dict[str, int] = {}
    for m in fleet(runs, seed=5, bad_every=0):
        ev = decode_input(m.value)
        if isinstance(ev, OutcomeReceipt):
            continue
        out.append((m.topic, m.key, m.value, ev.ts))
        if ev.__struct_config__.tag == "run_ended":
            ended[ev.run_id] = ev.ts
    for run_id, ts in ended.items():
        r = key.sign(OutcomeReceipt(run_id=run_id, ts=ts + 500, receipt_id=f"exp-{run_id}", kind="file",
                                    verifier="destination", verified=True,
                                    evidence={"size": 48213, "sha256": "ab" * 32, "content_type": "application/pdf",
                                              "checker_target": "0123456789abcdef"}))
        out.append(("outcomes", run_id.encode(), encode(r), r.ts))
    out.sort(key=lambda m: m[3])
    return out, key


def bench_signature_cost(runs: int, rounds: int) -> dict:
    import gc
    import zlib
    from bench.core import _Rec as Rec  # a consumed record, as the fold takes it

    from loopwarden import gctune
    from loopwarden.codecs import decode_outcome_event
    from loopwarden.rules import Settings
    from loopwarden.stages.health.task import PartitionTask
    from loopwarden.codecs import receipt_signing_bytes
    from loopwarden.trust import ReceiptTrust, TrustedVerifiers

    messages, key = _signed_fleet(runs)
    verifiers = TrustedVerifiers.parse(key.setting)
    channel = "agent.outcomes.verified"
    roles = {"agent.steps": "steps", "agent.outcomes": "outcomes", channel: "verified_outcomes",
             "loopwarden.ticks": "ticks"}

    def records(outcomes_topic: str) -> list:
        topics = {"steps": "agent.steps", "outcomes": outcomes_topic}
        offsets: dict = {}
        recs = []
        for topic, k, value, _ts in messages:
            t = topics[topic]
            offsets[t] = offsets.get(t, 0) + 1
            recs.append(Rec(t, zlib.crc32(k) % 1, offsets[t] - 1, k, value))
        return recs

    on_outcomes, on_channel = records("agent.outcomes"), records(channel)  # the same bytes; the receipts' topic differs
    last_ts = max(m[3] for m in messages)
    receipts = sum(1 for m in messages if m[0] == "outcomes")
    variants = {"plain": (on_outcomes, None), "signed": (on_outcomes, ReceiptTrust(verifiers, None)),
                "channel": (on_channel, ReceiptTrust(None, channel))}

    def fold(variant: str) -> float:
        recs, trust = variants[variant]
        store: dict = {}
        task = PartitionTask(0, store, roles, settings=Settings(), clock="event", wall_ms=lambda: last_ts, trust=trust)
        gc.collect()
        t0 = time.process_time()
        for i in range(0, len(recs), 2500):
            out = task.fold(recs[i:i + 2500])
            task.committed(out)
            for k, v in out.changes.items():
                if v is None:
                    store.pop(k, None)
                else:
                    store[k] = v
        return time.process_time() - t0

    gctune.for_streaming()
    cpu: dict[str, list[float]] = {v: [] for v in variants}
    for r in range(rounds):  # interleaved (the order rotated), so load from elsewhere hits each alike
        order = list(variants)[r % 3:] + list(variants)[:r % 3]
        for v in order:
            cpu[v].append(fold(v))
    sample = decode_outcome_event(next(m[2] for m in messages if m[0] == "outcomes"))
    n = 5000
    t0 = time.process_time()
    for _ in range(n):
        verifiers.why_untrusted(sample)
    per_check = (time.process_time() - t0) / n
    t0 = time.process_time()
    for _ in range(n):
        receipt_signing_bytes(sample)
    per_canonical = (time.process_time() - t0) / n
    p, t, c = median(cpu["plain"]), median(cpu["signed"]), median(cpu["channel"])
    events = len(on_outcomes)
    return {"events": events, "receipts": receipts, "runs": runs, "rounds": rounds, "plain_ev_s": events / p,
            "trusted_ev_s": events / t, "ratio": p / t, "channel_ev_s": events / c, "channel_ratio": p / c,
            "per_check_us": per_check * 1e6, "per_canonical_us": per_canonical * 1e6,
            "per_event_us_plain": p / events * 1e6}


def measure(quick: bool, concurrency: int = 512, trust_only: bool = False) -> tuple[dict, dict, list]:
    cost = bench_signature_cost(2000 if quick else 10000, 3 if quick else 7)
    if trust_only:
        checks = {"concurrency": concurrency, "per_s": float("nan"), "checks": 0, "seconds": 0.0}
    else:
        checks = bench_checks(2000 if quick else 10000, concurrency)
    rows = [
        ("a checks", f"http checker vs a 50 ms HTTPS destination, {checks['concurrency']} in flight",
         f"{checks['per_s']:.0f} checks/s", f"{checks['checks']} checks in {checks['seconds']:.2f} s; target >= 1000"),
        ("b signatures", "one check: canonical bytes + Ed25519 verify", f"{cost['per_check_us']:.0f} µs CPU",
         f"canonical bytes alone {cost['per_canonical_us']:.1f} µs; the fold costs "
         f"{cost['per_event_us_plain']:.1f} µs/event here"),
        ("b signatures", f"worker fold, {cost['runs']} runs, {cost['events']} events, one signed receipt per run",
         f"{cost['trusted_ev_s'] / 1000:.1f} kev/s with / {cost['plain_ev_s'] / 1000:.1f} kev/s without",
         f"ratio {cost['ratio']:.3f} (target >= 0.95); cost {100 * (1 - cost['ratio']):.1f} % of ingest (CPU, "
         f"median of {cost['rounds']})"),
        ("b channel", "worker fold, one receipt per run on the verifiers' topic (trusted by channel)",
         f"{cost['channel_ev_s'] / 1000:.1f} kev/s with / {cost['plain_ev_s'] / 1000:.1f} kev/s without",
         f"ratio {cost['channel_ratio']:.3f} (target >= 0.95); cost {100 * (1 - cost['channel_ratio']):.1f} % of "
         f"ingest (CPU, median of {cost['rounds']})"),
    ]
    return checks, cost, rows


def verify_rows(report, quick: bool) -> None:
    """The rows of `python -m bench.run --only verify`."""
    _checks, _cost, rows = measure(quick)
    for bench, what, result, note in rows:
        report.add(f"v {bench}", what, result, note)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.verify")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--concurrency", type=int, default=512)
    parser.add_argument("--trust-only", action="store_true", help="only part b (the worker's fold), not checks/s")
    args = parser.parse_args()
    checks, cost, rows = measure(args.quick, args.concurrency, args.trust_only)
    if args.trust_only:
        rows = rows[1:]
    print(f"{'bench':<14} {'what':<78} {'result':<34} notes")
    for r in rows:
        print(f"{r[0]:<14} {r[1]:<78} {r[2]:<34} {r[3]}")
    print(json.dumps({"checks": checks, "signatures": cost}))


if __name__ == "__main__":
    main()
