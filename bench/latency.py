"""Bench g: event -> output latency, the worker beside the Quix Streams peer, in one run on one broker.

Per app, fresh topics (8 partitions, as bench e), the app started and then fed one paced
stream: a simulated fleet published at a fixed rate for ``warm_s + measure_s`` seconds,
every valid event re-stamped with the wall clock as it is sent. A ``read_committed``
consumer in a process of its own (never held by the publisher's busy loop) reads the app's
output, as a downstream reader would, and takes arrival wall time minus the event's send time:

* **worker** - ``loopwarden worker``; output agent.health, send time = the transition's ``ts``
  (the stamped event's). Only events that change a run's state give a transition.
* **quix** / **quix-min** - ``bench/peers/quix_app.py`` at Quix's default commit interval
  and at the smallest one we found workable (``QUIX_MIN_COMMIT_S``); one output per
  input, carrying the input's Kafka timestamp (set by the producer at send).

Outputs of events sent during the warm-up are left out. Percentiles are of the raw
samples (not histogram buckets). The same rate for every app (half the slowest app's
maximum, so each one keeps up), and the worker once more at half its own maximum.
For the worker, its own metrics over the measured phase give the cycle: records per
transaction, begin -> commit of a transaction, transactions per second.
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import os
import statistics
import sys
import time
import urllib.request
import uuid
from pathlib import Path

import msgspec
from msgspec.structs import replace
from aiokafka import AIOKafkaConsumer
from prometheus_client.parser import text_string_to_metric_families

from bench.kafka import _minus, quantile
from bench.sender import Sender
from bench.common import Report, cpu_s, duration, jit_cpu_s, progress, si
from bench import ingest as ingest_bench
from bench.ingest import PARTITIONS, REPO, _env, _readyz, create_topics, spawn, start_broker, stop, stop_all
from dev.localkafka import free_port
from loopwarden.codecs import decode_input, encode
from loopwarden.simulate import fleet

BENCH = "g latency"
QUIX_MIN_COMMIT_S = 0.1  # below this Quix spends its time committing (see bench/README.md)
WARMUP_S = 15.0  # one warm-up run of a worker on the new broker (warm_up)
WARMUP_RUNS = (2, 16)  # at least, at most (bench.run's --quick: 2, 2)
JIT_QUIET = 0.05  # warm: the broker's JIT compiler threads took at most this share of a core over a warm-up run


class _Ts(msgspec.Struct):
    ts: int


_decode_ts = msgspec.json.Decoder(_Ts).decode


class Reader:
    """A read_committed consumer of one output topic in the bench's own event loop: latency samples of outputs
    of events sent after ``since_ms``. Its arrivals wait while the publisher's loop is busy (behind its pace it
    sends without yielding): kept only to show that (``BENCH_LATENCY_LOOP_READER=1``); the figures are
    :class:`ProcessReader`'s."""

    def __init__(self, bootstrap: str, topic: str, stamp: str) -> None:
        self.bootstrap, self.topic, self.stamp = bootstrap, topic, stamp
        self.since_ms = float("inf")
        self.samples: list[float] = []
        self.count = 0
        self.last_arrival = 0.0
        self._stop = False

    async def run(self) -> None:
        consumer = AIOKafkaConsumer(self.topic, bootstrap_servers=self.bootstrap, auto_offset_reset="earliest",
                                    enable_auto_commit=False, group_id=None, isolation_level="read_committed",
                                    fetch_max_wait_ms=10)
        await consumer.start()
        try:
            while not self._stop:
                batch = await consumer.getmany(timeout_ms=50)
                now_ms = time.time() * 1000
                for records in batch.values():
                    for rec in records:
                        sent = _decode_ts(rec.value).ts if self.stamp == "value" else rec.timestamp
                        self.count += 1
                        self.last_arrival = time.monotonic()
                        if sent >= self.since_ms:
                            self.samples.append((now_ms - sent) / 1000)
        finally:
            await consumer.stop()

    def stop(self) -> None:
        self._stop = True


class ProcessReader:
    """The same reader in a process of its own, so that no arrival waits for the publisher's loop: it keeps
    (send ms, arrival ms) of every output; ``samples`` are those of events sent after ``since_ms``."""

    def __init__(self, bootstrap: str, topic: str, stamp: str, out: Path) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.since_ms = float("inf")
        self.samples: list[float] = []
        self._count, self._last = ctx.Value("q", 0), ctx.Value("d", 0.0)
        self._stop, self._out = ctx.Event(), out
        self._proc = ctx.Process(target=_read_in_process, args=(bootstrap, topic, stamp, self._count, self._last,
                                                                self._stop, str(out)), daemon=True)
        self._proc.start()

    @property
    def count(self) -> int:
        return self._count.value

    @property
    def last_arrival(self) -> float:
        return self._last.value  # time.monotonic() of the reader's process: one clock for the machine

    def stop(self) -> None:
        self._stop.set()
        self._proc.join(60)
        if self._proc.is_alive():
            self._proc.kill()
        pairs = json.loads(self._out.read_text()) if self._out.exists() else []
        self.samples = [(arrived - sent) / 1000 for sent, arrived in pairs if sent >= self.since_ms]


def _read_in_process(bootstrap: str, topic: str, stamp: str, count, last, stop, out: str) -> None:
    pairs: list[tuple[float, float]] = []

    async def read() -> None:
        consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest",
                                    enable_auto_commit=False, group_id=None, isolation_level="read_committed",
                                    fetch_max_wait_ms=10)
        await consumer.start()
        try:
            while not stop.is_set():
                batch = await consumer.getmany(timeout_ms=50)
                now_ms = time.time() * 1000
                for records in batch.values():
                    for rec in records:
                        pairs.append((_decode_ts(rec.value).ts if stamp == "value" else rec.timestamp, now_ms))
                if batch:
                    count.value = len(pairs)
                    last.value = time.monotonic()
        finally:
            await consumer.stop()

    asyncio.run(read())
    Path(out).write_text(json.dumps(pairs))


def _q(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] if values else float("nan")


def _metrics(port: int) -> dict[str, list]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    return {f.name: f.samples for f in text_string_to_metric_families(text)}


def _hist(samples: dict, name: str) -> tuple[float, float, list[tuple[float, float]]]:
    fam = samples.get(name, [])
    total = sum(s.value for s in fam if s.name == name + "_sum")
    count = sum(s.value for s in fam if s.name == name + "_count")
    cum = sorted((float(s.labels["le"]), s.value) for s in fam if s.name == name + "_bucket")
    return total, count, cum


async def one_app(app: str, bootstrap: str, workdir: Path, rate: float, warm_s: float, measure_s: float,
                  seed: int, broker_pid: int | None = None) -> dict:
    tag = uuid.uuid4().hex[:8]
    steps, outcomes = f"lat-steps-{tag}", f"lat-outcomes-{tag}"
    adir = workdir / f"{app}-{tag}"
    adir.mkdir(parents=True)
    port = free_port()
    if app.startswith("worker"):
        output = f"lat-health-{tag}"
        env = _env({
            "LOOPWARDEN_BROKER": bootstrap, "LOOPWARDEN_APP_ID": f"lat-{tag}",
            "LOOPWARDEN_STEPS_TOPIC": steps, "LOOPWARDEN_OUTCOMES_TOPIC": outcomes,
            "LOOPWARDEN_HEALTH_TOPIC": output, "LOOPWARDEN_DEADLETTER_TOPIC": f"lat-dead-{tag}",
            "LOOPWARDEN_TICKS_TOPIC": f"lat-ticks-{tag}", "LOOPWARDEN_PARTITIONS": str(PARTITIONS),
            "LOOPWARDEN_CLOCK": "event", "LOOPWARDEN_WEB_PORT": str(port), "LOOPWARDEN_DATA_DIR": str(adir / "data"),
        })
        if app == "worker-alt":
            env.update(ingest_bench.alt_env())
        argv = [sys.executable, "-m", "loopwarden.cli", "worker"]
        # The output too (as the worker would make it: plain, PARTITIONS): the reader subscribes before the worker
        # is up, and aiokafka would log "Topic ... not found in cluster metadata" 8-10 times a run.
        await create_topics(bootstrap, [steps, outcomes, output])
        stamp = "value"
    else:
        output = f"lat-out-{tag}"
        await create_topics(bootstrap, [steps, outcomes, output])
        env = _env({
            "PEER_BROKER": bootstrap, "PEER_GROUP": f"lat-{tag}", "PEER_STEPS": steps, "PEER_OUTCOMES": outcomes,
            "PEER_OUTPUT": output, "PEER_STATE_DIR": str(adir / "state"), "PEER_READY_FILE": str(adir / "ready.json"),
            "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1",
        })
        if app == "quix-min":
            env["PEER_COMMIT_INTERVAL"] = str(QUIX_MIN_COMMIT_S)
        argv = [sys.executable, "-m", "bench.peers.quix_app"]
        stamp = "timestamp"
    proc = spawn(argv, env, adir / "app.log")
    reader = ProcessReader(bootstrap, output, stamp, adir / "arrivals.json")
    loop_reader = Reader(bootstrap, output, stamp) if os.environ.get("BENCH_LATENCY_LOOP_READER") else None
    task = asyncio.create_task(loop_reader.run()) if loop_reader is not None else None
    res: dict = {"app": app, "rate": rate}
    sender = Sender(bootstrap)
    try:
        if app.startswith("worker"):
            deadline = time.monotonic() + 120
            while not _readyz(port):
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"{app} did not get ready; see {adir / 'app.log'}")
                await asyncio.sleep(0.1)
        n = int(rate * (warm_s + measure_s))
        messages = [m for m in fleet(n // 6 + 50, seed=seed, start_ms=int(time.time() * 1000)) if m.valid][:n]
        events = [decode_input(m.value) if m.valid else None for m in messages]
        topics = {"steps": steps, "outcomes": outcomes}
        if not app.startswith("worker"):
            # A peer is ready at its first message: send a few and wait for it, then pace the rest.
            head, messages, events = messages[:5], messages[5:], events[5:]
            for m in head:
                sender.send(topics[m.topic], m.key, m.value)
            sender.flush()
            deadline = time.monotonic() + 120
            while not (adir / "ready.json").exists():
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"{app} did not get ready; see {adir / 'app.log'}")
                await asyncio.sleep(0.05)
        mark: dict = {}
        measure_at = time.monotonic() + warm_s

        def on_turn(now: float) -> None:
            if not mark and now >= measure_at:  # the measured phase starts: the app's and the bench's CPU from here
                reader.since_ms = time.time() * 1000
                if loop_reader is not None:
                    loop_reader.since_ms = reader.since_ms
                mark.update(c0=cpu_s(proc.pid), tm0=time.monotonic(), b0=time.process_time(),
                            k0=cpu_s(broker_pid) if broker_pid else float("nan"),
                            j0=jit_cpu_s(broker_pid) if broker_pid else float("nan"))
                if app.startswith("worker"):
                    mark["before"] = _metrics(port)

        def send_one(item, ts_ms: int) -> None:
            m, ev = item
            # The Kafka timestamp too (Quix's outputs carry it): every app measured from the same stamp.
            sender.send(topics[m.topic], m.key, m.value if ev is None else encode(replace(ev, ts=ts_ms)), ts_ms)

        sent_s = await sender.paced(list(zip(messages, events)), rate, send_one, on_turn)
        b1, tb1 = time.process_time(), time.monotonic()
        k1 = cpu_s(broker_pid) if broker_pid else float("nan")
        j1 = jit_cpu_s(broker_pid) if broker_pid else float("nan")
        sender.flush()
        sent_s += time.monotonic() - tb1  # until the last one was acknowledged
        c0, before = mark.get("c0"), mark.get("before")
        tm0, b0 = mark.get("tm0", 0.0), mark.get("b0", 0.0)
        res["sent_eps"] = len(messages) / sent_s
        # Let the last commits land (Quix's default interval is 5 s).
        settle = time.monotonic() + 8.0
        while time.monotonic() < settle:
            last = reader.count
            await asyncio.sleep(1.5)
            if reader.count == last and reader.count > 0 and time.monotonic() - reader.last_arrival > 1.0 \
                    and (app.startswith("worker") or time.monotonic() > settle - 2):
                break
        res["cpu_share"] = (cpu_s(proc.pid) - c0) / (time.monotonic() - tm0) if c0 is not None else float("nan")
        res["sender_share"] = (b1 - b0) / (tb1 - tm0) if c0 is not None else float("nan")
        res["broker_share"] = (k1 - mark["k0"]) / (tb1 - tm0) if c0 is not None else float("nan")
        res["broker_jit_share"] = (j1 - mark["j0"]) / (tb1 - tm0) if c0 is not None else float("nan")
        if proc.poll() is not None:
            raise RuntimeError(f"{app} exited with {proc.returncode}; see {adir / 'app.log'}")
        if app.startswith("worker") and before is not None:
            after = _metrics(port)
            t_sum1, t_n1, _ = _hist(after, "loopwarden_transaction_seconds")
            t_sum0, t_n0, _ = _hist(before, "loopwarden_transaction_seconds")
            b_sum1, b_n1, _ = _hist(after, "loopwarden_batch_records")
            b_sum0, b_n0, _ = _hist(before, "loopwarden_batch_records")
            txns = t_n1 - t_n0
            _, _, e1 = _hist(after, "loopwarden_event_to_transition_seconds")
            _, _, e0 = _hist(before, "loopwarden_event_to_transition_seconds")
            own = _minus(e1, e0)
            res.update(own_p50=quantile(0.5, own), own_p99=quantile(0.99, own))
            res.update(txn_mean=(t_sum1 - t_sum0) / txns if txns else float("nan"),
                       txn_per_s=txns / measure_s, records_per_txn=(b_sum1 - b_sum0) / max(b_n1 - b_n0, 1))
    finally:
        sender.close()
        reader.stop()
        if loop_reader is not None:
            loop_reader.stop()
            await task
            res.update(loop_p50=_q(loop_reader.samples, 0.5), loop_p99=_q(loop_reader.samples, 0.99))
        stop(proc)
    res.update(n=len(reader.samples), p50=_q(reader.samples, 0.5), p99=_q(reader.samples, 0.99),
               mean=statistics.fmean(reader.samples) if reader.samples else float("nan"))
    return res


def warm_up(kafka, workdir: Path, rate: float, runs: tuple[int, int] = WARMUP_RUNS) -> list[tuple[float, float]]:
    """A worker at ``rate`` on the new broker, run after run, not counted, until the broker is warm: its JIT compiler
    threads took at most ``JIT_QUIET`` of a core over the last run (after ``runs[0]`` runs at least), or ``runs[1]``
    runs; returns (the broker's share of a core, its JIT's) per run. Where /proc names no thread (not Linux), until
    the broker's share settles within 10 % of the run before.

    A new broker compiles Kafka's code for minutes: HotSpot's C2 thread took 20-60 % of a core through the first
    1.5-2 minutes of load here, and the same worker's p50 fell from 121 to 39-42 ms, its p99 from 320-540 to
    89-98 ms, as it finished (bench/README.md "g latency"). The broker's share alone (within 10 % of the run
    before) can settle while it compiles: two runs at 110 % and 110 % were both compiling."""
    shares: list[tuple[float, float]] = []
    for i in range(runs[1]):
        progress(f"[g]   warm-up {i + 1}: a worker at {si(rate, 'ev/s')} for {WARMUP_S:.0f} s, not counted ...")
        res = asyncio.run(one_app("worker", kafka.bootstrap, workdir / "latency", rate, 2.0, WARMUP_S - 2.0,
                                  seed=90 + i, broker_pid=kafka.pid))
        share, jit = res["broker_share"], res["broker_jit_share"]
        shares.append((share, jit))
        progress(f"[g]   warm-up {i + 1}: p50 {duration(res['p50'])} p99 {duration(res['p99'])}, "
                 f"the broker {share:.0%} of a core, its JIT {jit:.0%}")
        if len(shares) < max(runs[0], 2):
            continue
        warm = jit <= JIT_QUIET if jit == jit else abs(share - shares[-2][0]) <= 0.1 * shares[-2][0]  # nan: no /proc
        if warm:
            break
    return shares


def latency(report: Report, workdir: Path, rate: float, own_rate: float | None, warm_s: float = 3.0,
            measure_s: float = 8.0, only: set[str] | None = None, rounds: int = 1,
            warmup_runs: tuple[int, int] = WARMUP_RUNS) -> None:
    """Worker and Quix (default and smallest commit interval) at ``rate``; the worker again at ``own_rate``."""
    progress("[g] latency: starting a local Kafka broker (KRaft) ...")
    kafka = start_broker(workdir / "kafka-latency")
    plan = [("worker", rate)] + ([("worker-alt", rate)] if ingest_bench.ALT_ENV else []) + \
        [("quix", rate), ("quix-min", rate)]
    if own_rate and own_rate > rate * 1.2:
        plan.append(("worker-own", own_rate))
    if only:
        plan = [(a, r) for a, r in plan if a in only]
    # More than one round: the order alternates (an app's position in the run is no advantage).
    plan = [step for i in range(rounds) for step in (plan if i % 2 == 0 else plan[::-1])]
    results, shares = [], []
    try:
        try:
            shares = warm_up(kafka, workdir, rate, warmup_runs)
        except (RuntimeError, TimeoutError, OSError) as exc:
            progress(f"[g]   warm-up: FAILED: {exc}")
        for i, (app, r) in enumerate(plan):
            progress(f"[g]   {app} at {si(r, 'ev/s')} for {warm_s + measure_s:.0f} s ...")
            try:
                res = asyncio.run(one_app(app, kafka.bootstrap, workdir / "latency", r, warm_s, measure_s, seed=31 + i,
                                          broker_pid=kafka.pid))
            except (RuntimeError, TimeoutError, OSError) as exc:
                progress(f"[g]   {app}: FAILED: {exc}")
                report.add(BENCH, app, "failed", str(exc).splitlines()[0][:160])
                continue
            if "own_p50" in res:
                progress(f"[g]     worker's own histogram p50 {duration(res['own_p50'])} p99 {duration(res['own_p99'])}; "
                         f"{res['txn_per_s']:.0f} txn/s, {res['records_per_txn']:.0f} records/txn, "
                         f"txn mean {duration(res['txn_mean'])}")
            progress(f"[g]   {app}: p50 {duration(res['p50'])} p99 {duration(res['p99'])} over {res['n']:,} outputs; "
                     f"sent {si(res['sent_eps'], 'ev/s')}, CPU share {res['cpu_share']:.0%}, "
                     f"the bench's sender {res['sender_share']:.0%}, "
                     f"the broker {res['broker_share']:.0%} (its JIT {res['broker_jit_share']:.0%})"
                     + (f"; read in the bench's loop: p50 {duration(res['loop_p50'])} p99 {duration(res['loop_p99'])}"
                        if "loop_p50" in res else ""))
            results.append(res)
    finally:
        stop_all()
        kafka.stop()
    labels = {"worker": "loopwarden worker", "quix": "Quix Streams, exactly-once, default commit (5 s)",
              "quix-min": f"Quix Streams, exactly-once, commit every {QUIX_MIN_COMMIT_S * 1000:.0f} ms",
              "worker-own": "loopwarden worker, at half its own maximum",
              "worker-alt": "loopwarden worker with " + " ".join(f"{k}={v}" for k, v in ingest_bench.ALT_ENV.items())}
    if shares:
        report.add(BENCH, "warm-up: the broker's CPU share (its JIT's), run by run",
                   " -> ".join(f"{x:.0%} ({j:.0%})" for x, j in shares),
                   f"a worker at {si(rate, 'ev/s')} for {WARMUP_S:.0f} s a run, not counted, until the broker's JIT compiler "
                   f"threads take <= {JIT_QUIET:.0%} of a core over a run or {warmup_runs[1]} runs; the measured apps come after")
    by: dict[str, dict] = {}
    for app in dict.fromkeys(r["app"] for r in results):  # in the plan's order
        runs = sorted((r for r in results if r["app"] == app), key=lambda r: r["p50"])
        res = by[app] = runs[(len(runs) - 1) // 2]  # the round with the median p50 (the lower middle of an even count)
        note = (f"{res['n']:,} outputs over {measure_s:.0f} s (read_committed, raw samples); mean {duration(res['mean'])}; "
                f"sent {si(res['sent_eps'], 'ev/s')}; app CPU {res['cpu_share']:.0%} of a core, the broker's "
                f"{res['broker_share']:.0%} (its JIT {res['broker_jit_share']:.0%}), the bench's sender's {res['sender_share']:.0%}")
        if res["app"].startswith("worker") and "txn_mean" in res:
            note += (f"; cycle: {res['txn_per_s']:.0f} transactions/s (8 partitions), {res['records_per_txn']:.0f} "
                     f"records each, begin -> commit mean {duration(res['txn_mean'])}")
        if len(runs) > 1:
            note += (f"; the round with the median p50 of {len(runs)}, rounds' p50 / p99: "
                     + ", ".join(f"{duration(r['p50'])} / {duration(r['p99'])}" for r in runs))
        if res["app"] == "worker":
            note += "; target p50 <= 50 ms, p99 <= 150 ms"
        report.add(BENCH, f"{labels[res['app']]} at {si(res['rate'], 'ev/s')}: p50 / p99",
                   f"{duration(res['p50'])} / {duration(res['p99'])}", note)
    if "worker" in by:
        for peer in ("quix", "quix-min"):
            if peer in by:
                w, q = by["worker"], by[peer]
                report.add(BENCH, f"ratio worker : {peer} latency p50 / p99", f"{w['p50'] / q['p50']:.2f} / {w['p99'] / q['p99']:.2f}",
                           "below 1: the worker's outputs arrive sooner")
