"""Bench e: ingest of one pre-loaded backlog, side by side: bare consumer, decode, Quix, Faust, loopwarden.

One broker, one backlog: the valid messages of a simulated fleet
(``loopwarden.simulate.fleet``, timestamps starting now), steps to a steps topic and
receipts to an outcomes topic, keyed by run id, 8 partitions each, all produced before
any consumer starts. Then, per round and round-robin (the order rotates each round):

* **bare** - an aiokafka consumer in this process, ``getmany`` until it holds every
  message, no decode: the physical limit of a Python consumer on this machine.
* **decode** - ``loopwarden.codecs.decode_input`` over the same values, offline.
* **quix** - ``bench/peers/quix_app.py`` (Quix Streams): a per-run count in State plus
  one output message per input, ``processing_guarantee="exactly-once"``.
* **faust** - ``bench/peers/faust_app.py``: a Faust agent doing nothing per event.
* **worker** - ``python -m loopwarden.cli worker`` (event clock, memory store).

The three apps run as subprocesses, each with its own consumer group (app id) on the
shared input topics, so each starts at offset 0; their own topics (output, health,
dead letters, ticks, changelogs) are fresh per app and round. Each is started after the
backlog is loaded. *Ready* is the first message handled (peers write a file then) or
``/readyz`` answering 200 (worker); *done* is the group's committed offsets reaching
the end offsets of both input topics (a black box: the same for every app and for any
worker runtime). Rates and CPU per event count from ready to done; startup (spawn to
ready) is reported apart. CPU is the subprocess's user + system time from /proc. A
worker still short of the end after ``worker_cap_s`` is stopped and reported as what
it committed over that time (labelled *capped*).
"""

from __future__ import annotations

import asyncio
import ctypes
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from bench.common import Report, cpu_s, duration, median, progress, si
from loopwarden.codecs import decode_input
from dev.localkafka import DEFAULT_JVM_ARGS, LocalKafka, free_port
from loopwarden.simulate import fleet

BENCH = "e ingest"
PARTITIONS = 8
REPO = Path(__file__).resolve().parent.parent
APPS = ("bare", "decode", "quix", "faust", "worker")
LABELS = {
    "bare": "bare aiokafka consumer (getmany, no decode)",
    "decode": "msgspec decode_input only (offline)",
    "quix": "Quix Streams: count per run + output, exactly-once",
    "faust": "Faust agent doing nothing per event",
    "worker": "loopwarden worker",
}
READY_TIMEOUT_S = 120.0
DONE_TIMEOUT_S = 600.0  # peers only; the worker has its cap
POLL_S = 0.1


def start_broker(workdir: Path) -> LocalKafka:
    # As bench/kafka.py: full JIT for the broker (LocalKafka defaults to C1 only, which starts faster).
    kafka = LocalKafka(workdir, heap="768m", clean=True, jvm_args=[*DEFAULT_JVM_ARGS, "-XX:TieredStopAtLevel=4"])
    kafka.start(timeout_s=180)
    return kafka


@dataclass
class Backlog:
    bootstrap: str
    steps: str
    outcomes: str
    values: list[bytes]
    counts: dict[str, int]
    ends: dict[TopicPartition, int] = field(default_factory=dict)
    produce_s: float = 0.0

    @property
    def n(self) -> int:
        return len(self.values)

    @property
    def partitions(self) -> list[TopicPartition]:
        return [TopicPartition(t, p) for t in (self.steps, self.outcomes) for p in range(PARTITIONS)]


@dataclass
class Result:
    app: str
    events: int  # consumed in the measured window (all of them unless capped)
    wall_s: float  # ready -> done
    cpu_s: float  # the app's CPU in that window
    startup_s: float = float("nan")  # spawn -> ready
    broker_cpu_s: float = float("nan")
    capped: bool = False

    @property
    def eps(self) -> float:
        return self.events / self.wall_s if self.wall_s > 0 else float("nan")

    @property
    def cpu_us(self) -> float:
        return self.cpu_s / self.events * 1e6 if self.events else float("nan")


def _events(events: int, seed: int) -> list:
    """The first ``events`` valid messages (in ts order) of a fleet big enough to hold them."""
    runs = events // 6 + 50
    while True:
        # Stamped in the past (a backlog): the worker dead-letters ts more than 5 min ahead of its clock.
        valid = [m for m in fleet(runs, seed=seed, start_ms=int(time.time() * 1000) - 86_400_000) if m.valid]
        if len(valid) >= events:
            return valid[:events]
        runs = int(runs * 1.3) + 50


async def create_topics(bootstrap: str, names: list[str], partitions: int = PARTITIONS) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(name, partitions, 1) for name in names])
    finally:
        await admin.close()


async def warm_up(bootstrap: str, tag: str) -> None:
    """Make the broker create __consumer_offsets and __transaction_state now, not in the first app's run."""
    topic = f"ingest-warmup-{tag}"
    await create_topics(bootstrap, [topic])
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, transactional_id=f"ingest-warmup-{tag}")
    await producer.start()
    try:
        async with producer.transaction():
            await producer.send_and_wait(topic, b"warm-up", partition=0)
    finally:
        await producer.stop()
    consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=f"ingest-warmup-{tag}",
                                auto_offset_reset="earliest", enable_auto_commit=False)
    await consumer.start()
    try:
        await consumer.getmany(timeout_ms=5_000)
        await consumer.commit()
    finally:
        await consumer.stop()


async def preload(bootstrap: str, events: int, seed: int) -> Backlog:
    messages = _events(events, seed)
    tag = uuid.uuid4().hex[:8]
    backlog = Backlog(bootstrap, f"ingest-steps-{tag}", f"ingest-outcomes-{tag}", [m.value for m in messages],
                      {"steps": 0, "outcomes": 0})
    await create_topics(bootstrap, [backlog.steps, backlog.outcomes])
    await warm_up(bootstrap, tag)
    topics = {"steps": backlog.steps, "outcomes": backlog.outcomes}
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=10, max_batch_size=256 * 1024)
    await producer.start()
    t0 = time.monotonic()
    try:
        pending = []
        for m in messages:
            pending.append(await producer.send(topics[m.topic], m.value, key=m.key))
            backlog.counts[m.topic] += 1
            if len(pending) >= 5_000:
                await asyncio.gather(*pending)
                pending.clear()
        await asyncio.gather(*pending)
    finally:
        await producer.stop()
    backlog.produce_s = time.monotonic() - t0
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False)
    await consumer.start()
    try:
        backlog.ends = await consumer.end_offsets(backlog.partitions)
    finally:
        await consumer.stop()
    if sum(backlog.ends.values()) != backlog.n:
        raise RuntimeError(f"preloaded {backlog.n} messages but the end offsets sum to {sum(backlog.ends.values())}")
    return backlog


async def run_bare(backlog: Backlog, broker_pid: int) -> Result:
    consumer = AIOKafkaConsumer(bootstrap_servers=backlog.bootstrap, group_id=None, enable_auto_commit=False,
                                auto_offset_reset="earliest")
    consumer.assign(backlog.partitions)
    t_spawn = time.monotonic()
    await consumer.start()
    try:
        await consumer.seek_to_beginning(*backlog.partitions)
        t0, c0, b0 = time.monotonic(), cpu_s(os.getpid()), cpu_s(broker_pid)
        got, last_progress = 0, t0
        while got < backlog.n:
            batch = await consumer.getmany(timeout_ms=500)
            for records in batch.values():
                got += len(records)
            now = time.monotonic()
            if batch:
                last_progress = now
            elif now - last_progress > 30:
                raise TimeoutError(f"bare consumer stuck at {got} of {backlog.n}")
        t1, c1, b1 = time.monotonic(), cpu_s(os.getpid()), cpu_s(broker_pid)
    finally:
        await consumer.stop()
    return Result("bare", got, t1 - t0, c1 - c0, startup_s=t0 - t_spawn, broker_cpu_s=b1 - b0)


def run_decode(backlog: Backlog) -> Result:
    values = backlog.values
    c0, t0 = time.process_time(), time.perf_counter()
    for v in values:
        decode_input(v)
    t1, c1 = time.perf_counter(), time.process_time()
    return Result("decode", len(values), t1 - t0, c1 - c0)


# --- subprocesses -------------------------------------------------------------------------------

_children: dict[int, subprocess.Popen] = {}


def _die_with_parent() -> None:  # pragma: no cover - runs in the child
    """PR_SET_PDEATHSIG: the child gets SIGTERM if the bench dies without cleaning up (SIGKILL)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)
    except (OSError, AttributeError):
        pass


def spawn(argv: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    with open(log, "ab") as out:
        proc = subprocess.Popen(argv, env=env, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, preexec_fn=_die_with_parent)
    _children[proc.pid] = proc
    return proc


def stop(proc: subprocess.Popen, grace_s: float = 15.0) -> None:
    """SIGTERM, then SIGKILL after ``grace_s``; always reaped."""
    try:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
    finally:
        _children.pop(proc.pid, None)


def stop_all() -> None:
    for proc in list(_children.values()):
        stop(proc, grace_s=5.0)


def _tail(log: Path, lines: int = 15) -> str:
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def _env(extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LOOPWARDEN_", "Quix__"))}
    env.update(extra)
    return env


def _readyz(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1) as resp:
            return resp.status == 200
    except OSError:
        return False


async def _committed(admin: AIOKafkaAdminClient, group: str, backlog: Backlog) -> int:
    """Messages the group has committed on the input topics (offsets capped at the end offsets)."""
    offsets = await admin.list_consumer_group_offsets(group, partitions=backlog.partitions)
    return sum(min(max(om.offset, 0), backlog.ends[tp]) for tp, om in offsets.items() if tp in backlog.ends)


async def run_app(app: str, backlog: Backlog, rdir: Path, broker_pid: int, cap_s: float) -> Result:
    tag = uuid.uuid4().hex[:8]
    group = f"ingest-{app}-{tag}"
    adir = rdir / f"{app}-{tag}"
    adir.mkdir(parents=True)
    log = adir / "app.log"
    ready_file = adir / "ready.json"
    port = 0
    if app == "worker":
        port = free_port()
        env = _env({
            "LOOPWARDEN_BROKER": backlog.bootstrap, "LOOPWARDEN_APP_ID": group,
            "LOOPWARDEN_STEPS_TOPIC": backlog.steps, "LOOPWARDEN_OUTCOMES_TOPIC": backlog.outcomes,
            "LOOPWARDEN_HEALTH_TOPIC": f"health-{tag}", "LOOPWARDEN_DEADLETTER_TOPIC": f"dead-{tag}",
            "LOOPWARDEN_TICKS_TOPIC": f"ticks-{tag}", "LOOPWARDEN_PARTITIONS": str(PARTITIONS),
            "LOOPWARDEN_CLOCK": "event", "LOOPWARDEN_WEB_PORT": str(port), "LOOPWARDEN_DATA_DIR": str(adir / "data"),
        })
        argv = [sys.executable, "-m", "loopwarden.cli", "worker"]
    else:
        output = f"quix-out-{tag}"
        if app == "quix":
            await create_topics(backlog.bootstrap, [output])
        env = _env({
            "PEER_BROKER": backlog.bootstrap, "PEER_GROUP": group, "PEER_STEPS": backlog.steps,
            "PEER_OUTCOMES": backlog.outcomes, "PEER_OUTPUT": output, "PEER_STATE_DIR": str(adir / "state"),
            "PEER_READY_FILE": str(ready_file), "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1",
        })
        argv = [sys.executable, "-m", f"bench.peers.{app}_app"]

    admin = AIOKafkaAdminClient(bootstrap_servers=backlog.bootstrap)
    await admin.start()
    t_spawn = time.monotonic()
    proc = spawn(argv, env, log)
    try:
        # Ready: the worker's /readyz, or the peer's file written at its first message.
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"{app} exited with {proc.returncode} before ready; {log}:\n{_tail(log)}")
            if app == "worker":
                if _readyz(port):
                    t_ready, c_ready = time.monotonic(), cpu_s(proc.pid)
                    break
            elif ready_file.exists():
                mark = json.loads(ready_file.read_text())
                t_ready, c_ready = mark["t"], mark["cpu"]
                break
            if time.monotonic() - t_spawn > READY_TIMEOUT_S:
                raise TimeoutError(f"{app} not ready after {READY_TIMEOUT_S:.0f}s; {log}:\n{_tail(log)}")
            await asyncio.sleep(0.02 if app != "worker" else 0.1)
        b_ready = cpu_s(broker_pid)
        limit = cap_s if app == "worker" else DONE_TIMEOUT_S
        # Done: the group's committed offsets at the end offsets of both input topics.
        while True:
            done = await _committed(admin, group, backlog)
            now, c_now, b_now = time.monotonic(), cpu_s(proc.pid), cpu_s(broker_pid)
            if done >= backlog.n:
                return Result(app, done, now - t_ready, c_now - c_ready, t_ready - t_spawn, b_now - b_ready)
            if proc.poll() is not None:
                raise RuntimeError(f"{app} exited with {proc.returncode} at {done} of {backlog.n}; "
                                   f"{log}:\n{_tail(log)}")
            if now - t_ready > limit:
                if app != "worker":
                    raise TimeoutError(f"{app} committed {done} of {backlog.n} in {limit:.0f}s; {log}")
                return Result(app, done, now - t_ready, c_now - c_ready, t_ready - t_spawn, b_now - b_ready,
                              capped=True)
            await asyncio.sleep(POLL_S)
    finally:
        await asyncio.shield(admin.close())
        stop(proc)


# --- the bench ----------------------------------------------------------------------------------


async def _rounds(bootstrap: str, broker_pid: int, workdir: Path, events: int, rounds: int,
                  cap_s: float) -> tuple[Backlog, dict[str, list[Result]], dict[str, str]]:
    progress(f"[e] preloading {events:,} events (steps + outcomes, {PARTITIONS} partitions each) ...")
    backlog = await preload(bootstrap, events, seed=11)
    progress(f"[e]   {backlog.n:,} messages in {backlog.produce_s:.1f}s "
             f"(steps {backlog.counts['steps']:,}, outcomes {backlog.counts['outcomes']:,})")
    results: dict[str, list[Result]] = {a: [] for a in APPS}
    errors: dict[str, str] = {}
    for i in range(rounds):
        order = APPS[i % len(APPS):] + APPS[:i % len(APPS)]
        progress(f"[e] round {i + 1}/{rounds}: {', '.join(order)}")
        rdir = workdir / f"round-{i}"
        for app in order:
            if app in errors:
                continue
            try:
                if app == "bare":
                    res = await run_bare(backlog, broker_pid)
                elif app == "decode":
                    res = run_decode(backlog)
                else:
                    res = await run_app(app, backlog, rdir, broker_pid, cap_s)
            except (RuntimeError, TimeoutError, OSError) as exc:
                progress(f"[e]   {app}: FAILED: {exc}")
                errors[app] = str(exc).splitlines()[0]
                continue
            results[app].append(res)
            progress(f"[e]   {app:<7} {si(res.eps, 'ev/s'):>11}  {res.cpu_us:7.1f} µs CPU/event  "
                     f"{res.wall_s:6.1f} s"
                     + (f"  startup {res.startup_s:4.1f} s" if res.startup_s == res.startup_s else "")
                     + (f"  CAPPED at {res.events:,} of {backlog.n:,}" if res.capped else ""))
    return backlog, results, errors


def ingest(report: Report, workdir: Path, events: int, rounds: int, worker_cap_s: float = 40.0) -> float | None:
    """Print the ingest comparison; returns the worker's median events/s (None if it failed)."""
    progress("[e] starting a local Kafka broker (KRaft) ...")
    t = time.monotonic()
    kafka = start_broker(workdir / "kafka-ingest")
    progress(f"[e] broker ready on {kafka.bootstrap} in {time.monotonic() - t:.0f}s")
    try:
        backlog, results, errors = asyncio.run(
            _rounds(kafka.bootstrap, kafka.pid, workdir / "ingest", events, rounds, worker_cap_s))
    finally:
        stop_all()
        kafka.stop()
    _report(report, backlog, results, errors, rounds, worker_cap_s)
    worker = [r.eps for r in results.get("worker", []) if not r.capped]
    return median(worker) if worker else None


def _report(report: Report, backlog: Backlog, results: dict[str, list[Result]], errors: dict[str, str],
            rounds: int, cap_s: float) -> None:
    def med(app: str, attr: str) -> float:
        return median([getattr(r, attr) for r in results[app]])

    report.add(BENCH, "backlog (valid fleet events, pre-loaded)", f"{backlog.n:,}",
               f"steps {backlog.counts['steps']:,} / outcomes {backlog.counts['outcomes']:,}, {PARTITIONS} partitions "
               f"each; produced at {si(backlog.n / backlog.produce_s, 'msg/s')}; median of {rounds} round(s)")
    for app in APPS:
        label = LABELS[app]
        if not results[app]:
            report.add(BENCH, label, "failed", errors.get(app, "no result")[:160])
            continue
        capped = any(r.capped for r in results[app])
        if capped:
            label += f" (capped at {cap_s:.0f} s)"
        note = f"CPU {med(app, 'cpu_us'):.3g} µs/event; {duration(med(app, 'wall_s'))} wall"
        if app == "decode":
            note += "; in-process, one core"
        elif app == "bare":
            note += "; in-process, from consumer.start()"
        else:
            note += f"; startup {duration(med(app, 'startup_s'))} (spawn -> ready)"
        if app != "decode":
            note += f"; broker CPU {med(app, 'broker_cpu_s') / med(app, 'events') * 1e6:.3g} µs/event"
        if capped:
            note += (f"; CAPPED: {int(med(app, 'events')):,} of {backlog.n:,} committed in {med(app, 'wall_s'):.0f} s, "
                     "rate = committed / time")
        if app == "worker":
            spawn_to_done = med(app, "startup_s") + med(app, "wall_s")
            note += f"; from spawn {si(med(app, 'events') / spawn_to_done, 'ev/s')}"
        report.add(BENCH, label, si(med(app, "eps"), "ev/s"), note)

    def ratio(a: str, b: str) -> tuple[float, float]:
        if not results[a] or not results[b]:
            return float("nan"), float("nan")
        return med(a, "eps") / med(b, "eps"), med(a, "cpu_us") / med(b, "cpu_us")

    def x(value: float) -> str:
        return f"{value:.3g}x" if value == value else "n/a"

    r, c = ratio("worker", "quix")
    report.add(BENCH, "ratio loopwarden worker : Quix (ev/s)", x(r), f"target >= 1.5; CPU per event {x(c)} Quix's")
    for app in ("decode", "quix", "faust", "worker"):
        r, c = ratio(app, "bare")
        report.add(BENCH, f"ratio {app} : bare consumer (ev/s)", x(r), f"CPU per event {x(c)} the bare consumer's")
