"""Bench c: one ``loopwarden worker`` on a real local Kafka broker, end to end.

Per round: fresh topics and app id, one worker subprocess (event-time clock), a
consumer on agent.health started before publishing; then a small fleet published at
a fixed rate below capacity (latency), then a large one as fast as the producer goes
(throughput, and latency under a backlog). Every valid event is re-stamped with the
wall clock as it is sent (per-run order kept), so the worker's
``loopwarden_event_to_transition_seconds`` histogram measures the pipeline's delay
rather than the age of synthetic timestamps; the same stamped bytes are then run
through offline replay, which gives the expected final state of every run and the
side-by-side replay rate.

Phases: *ingest* ends when the worker has consumed every published message and all
transitions it counted are on agent.health; then one tick per partition moves the
event-time clock past every timeout, and *end to end* ends when every run's latest
transition on agent.health is the state replay reached.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import msgspec
from aiokafka import AIOKafkaConsumer
from prometheus_client.parser import text_string_to_metric_families

from bench.common import Report, cpu_s, duration, median, nbytes, progress, rss_kb, si
from bench.sender import Sender
from loopwarden.codecs import decode_input, encode
from dev.localkafka import DEFAULT_JVM_ARGS, LocalKafka, free_port
from loopwarden.publisher import Publisher
from loopwarden.replay import Replay
from loopwarden.simulate import fleet
from loopwarden.config import Config
from loopwarden.stages.health.task import Tick, encode_tick
from loopwarden.stages.topics import ensure_topics

ADVANCE_S = 700.0
ROOT = Path(__file__).resolve().parent.parent
PROBE = ROOT / "bench" / "probe"
TRIM_WAIT_S = 1.5  # the bench's worker trims the C heap every 1 s  # past the default inactivity (300 s) and receipt window (600 s)


class _Seen(msgspec.Struct):
    run_id: str
    seq: int
    to_state: str


_decode_seen = msgspec.json.Decoder(_Seen).decode


def start_broker(workdir: Path) -> LocalKafka:
    # Full JIT for the broker (LocalKafka defaults to C1 only, which starts faster).
    kafka = LocalKafka(workdir, heap="768m", clean=True, jvm_args=[*DEFAULT_JVM_ARGS, "-XX:TieredStopAtLevel=4"])
    kafka.start(timeout_s=180)
    return kafka


def unique_config(bootstrap: str, partitions: int) -> Config:
    tag = uuid.uuid4().hex[:8]
    return Config(
        broker=bootstrap, app_id=f"bench-{tag}", steps_topic=f"steps-{tag}", outcomes_topic=f"outcomes-{tag}",
        health_topic=f"health-{tag}", deadletter_topic=f"dead-{tag}", ticks_topic=f"ticks-{tag}",
        partitions=partitions, clock="event",
    )


@dataclass
class WorkerProc:
    config: Config
    workdir: Path
    web_port: int = field(default_factory=free_port)
    proc: subprocess.Popen | None = None
    env: dict[str, str] = field(default_factory=dict)  # extra LOOPWARDEN_* settings (the A/B main below)
    root: Path = ROOT  # the source tree whose loopwarden runs (another worktree: the code before)

    @property
    def probe_dir(self) -> Path:
        return self.workdir / "probe"

    def malloc_stats(self, timeout_s: float = 30) -> dict:
        """pymalloc's figures in the worker now (bench/probe/sitecustomize.py), after a gc.collect."""
        assert self.proc is not None
        n = len(list(self.probe_dir.glob("*.json")))
        self.proc.send_signal(signal.SIGUSR1)
        path = self.probe_dir / f"{n}.json"
        deadline = time.monotonic() + timeout_s
        while not path.exists():
            if time.monotonic() > deadline:
                return {}
            time.sleep(0.05)
        return msgspec.json.decode(path.read_bytes())

    def start(self, timeout_s: float = 90) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("LOOPWARDEN_")}
        c = self.config
        env.update({
            "LOOPWARDEN_BROKER": c.broker, "LOOPWARDEN_APP_ID": c.app_id, "LOOPWARDEN_STEPS_TOPIC": c.steps_topic,
            "LOOPWARDEN_OUTCOMES_TOPIC": c.outcomes_topic, "LOOPWARDEN_HEALTH_TOPIC": c.health_topic,
            "LOOPWARDEN_DEADLETTER_TOPIC": c.deadletter_topic, "LOOPWARDEN_TICKS_TOPIC": c.ticks_topic,
            "LOOPWARDEN_PARTITIONS": str(c.partitions), "LOOPWARDEN_CLOCK": "event",
            "LOOPWARDEN_WEB_PORT": str(self.web_port), "LOOPWARDEN_DATA_DIR": str(self.workdir / "data"),
            # malloc_trim every second, not every 30 s: the RSS read after each phase is what a worker
            # running for minutes holds, not the last burst's freed pages (loopwarden.engine.memory).
            "LOOPWARDEN_MALLOC_TRIM_S": "1",
            # bench/probe/sitecustomize.py: pymalloc's figures on SIGUSR1, read at each RSS mark (Round.memory)
            "LOOPWARDEN_BENCH_PROBE": str(self.probe_dir),
            "PYTHONPATH": os.pathsep.join([str(PROBE), str(self.root), *filter(None, [os.environ.get("PYTHONPATH")])]),
        })
        env.update(self.env)
        self.probe_dir.mkdir(parents=True, exist_ok=True)
        self.log = self.workdir / "worker.log"
        self.proc = subprocess.Popen([sys.executable, "-m", "loopwarden.cli", "worker"], env=env, cwd=self.root,
                                     stdout=open(self.log, "ab"), stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"worker exited with {self.proc.returncode}; see {self.log}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.web_port}/readyz", timeout=2) as resp:
                    if resp.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.2)
        raise TimeoutError(f"worker not ready after {timeout_s}s; see {self.log}")

    def metrics(self) -> dict[str, list]:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.web_port}/metrics", timeout=5) as resp:
            text = resp.read().decode()
        return {f.name: f.samples for f in text_string_to_metric_families(text)}

    def cpu_s(self) -> float:
        assert self.proc is not None
        return cpu_s(self.proc.pid)

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)


def _sum(samples: list, name: str, **labels) -> float:
    return sum(s.value for s in samples if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()))


HISTOGRAMS = {"event": "loopwarden_event_to_transition_seconds", "timer": "loopwarden_timer_to_transition_seconds",
              "txn": "loopwarden_transaction_seconds"}


def buckets(samples: list, name: str = HISTOGRAMS["event"]) -> list[tuple[float, float]]:
    """Cumulative (le, count) buckets of histogram ``name``."""
    return sorted((float(s.labels["le"]), s.value) for s in samples if s.name == name + "_bucket")


def quantile(q: float, cumulative: list[tuple[float, float]]) -> float:
    """histogram_quantile as Prometheus computes it: linear inside the bucket."""
    if not cumulative or cumulative[-1][1] == 0:
        return float("nan")
    rank = q * cumulative[-1][1]
    lo_bound, lo_count = 0.0, 0.0
    for bound, count in cumulative:
        if count >= rank:
            if bound == float("inf"):
                return lo_bound  # beyond the last finite bucket: its bound is all we know
            return lo_bound + (bound - lo_bound) * ((rank - lo_count) / max(count - lo_count, 1e-12))
        lo_bound, lo_count = bound, count
    return float("nan")


def _minus(after: list[tuple[float, float]], before: list[tuple[float, float]]) -> list[tuple[float, float]]:
    old = dict(before)
    return [(le, count - old.get(le, 0.0)) for le, count in after]


class Collector:
    """Reads agent.health from the beginning; records each transition's arrival time."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.count = 0
        self.last_arrival = 0.0
        self.latest: dict[str, tuple[int, str]] = {}
        self.paths: dict[str, list[tuple[int, str]]] = {}  # run id -> (seq, to_state) of each transition
        self._stop = False

    async def run(self) -> None:
        consumer = AIOKafkaConsumer(self.config.health_topic, bootstrap_servers=self.config.bootstrap,
                                    auto_offset_reset="earliest", enable_auto_commit=False, group_id=None,
                                    isolation_level="read_committed")  # as agent.health's consumers read
        await consumer.start()
        try:
            while not self._stop:
                batch = await consumer.getmany(timeout_ms=100)
                now = time.monotonic()
                for records in batch.values():
                    for rec in records:
                        seen = _decode_seen(rec.value)
                        old = self.latest.get(seen.run_id)
                        if old is None or seen.seq > old[0]:
                            self.latest[seen.run_id] = (seen.seq, seen.to_state)
                        self.paths.setdefault(seen.run_id, []).append((seen.seq, seen.to_state))
                        self.count += 1
                        self.last_arrival = now
        finally:
            await consumer.stop()

    def stop(self) -> None:
        self._stop = True


def _path_diffs(replayed: dict[str, list[str]], seen: dict[str, list[tuple[int, str]]]) -> list[tuple[str, list, list]]:
    """Runs whose transitions on agent.health (by seq) are not replay's: (run id, worker's, replay's)."""
    diffs = []
    for run_id, want in replayed.items():
        got = [state for _seq, state in sorted(seen.get(run_id, []))]
        if got != want:
            diffs.append((run_id, got, want))
    return diffs


async def _wait(pred, timeout_s: float, every_s: float = 0.2) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if pred():
            return True
        await asyncio.sleep(every_s)
    return False


async def one_round(bootstrap: str, runs: int, paced_runs: int, pace_eps: float, partitions: int, workdir: Path,
                    seed: int, broker_pid: int, env: dict[str, str] | None = None, root: Path = ROOT,
                    more: int = 0) -> dict:
    config = unique_config(bootstrap, partitions)
    await ensure_topics(config)
    worker = WorkerProc(config, workdir, env=dict(env or {}), root=root)
    worker.start()
    try:
        return await Round(config, worker, broker_pid).measure(runs, paced_runs, pace_eps, seed, more)
    finally:
        worker.stop()


class Round:
    """One worker, fresh topics: a paced phase (latency), a fast phase (throughput), a final tick."""

    def __init__(self, config: Config, worker: WorkerProc, broker_pid: int) -> None:
        self.config, self.worker, self.broker_pid = config, worker, broker_pid
        self.collector = Collector(config)
        self.published = 0
        self.last_ts = 0
        self.stamped: list[bytes] = []  # valid events as sent, in order: replay's input
        self.samples: dict[str, list] = {}
        self.malloc: dict[str, dict] = {}  # mark -> pymalloc's figures in the worker (bench/probe)

    async def publish(self, runs: int, seed: int, rate_eps: float | None) -> tuple[int, float]:
        """Publish a fleet, re-stamping valid events with the wall clock; paced when ``rate_eps``."""
        messages = fleet(runs, seed=seed, start_ms=int(time.time() * 1000))
        events = [decode_input(m.value) if m.valid else None for m in messages]
        topics = {"steps": self.config.steps_topic, "outcomes": self.config.outcomes_topic}
        t0 = time.monotonic()

        def value_of(m, ev, now_ms: int) -> bytes:
            """The message's value: a valid event re-stamped (never before the last stamp) and kept for replay."""
            if ev is None:
                return m.value
            self.last_ts = max(self.last_ts, now_ms)
            value = encode(msgspec.structs.replace(ev, ts=self.last_ts))
            self.stamped.append(value)
            return value

        if rate_eps:  # paced: bench g's load generator (bench/sender.py), which leaves the cores to the worker
            with Sender(self.config.bootstrap) as sender:

                def send_one(item, ts_ms: int) -> None:
                    m, ev = item
                    sender.send(topics[m.topic], m.key, value_of(m, ev, ts_ms))

                await sender.paced(list(zip(messages, events)), rate_eps, send_one)
                sender.flush()
        else:  # as fast as it goes: the backlogs the memory rows are read over
            async with Publisher(self.config.bootstrap, self.config.steps_topic, self.config.outcomes_topic) as pub:
                for m, ev in zip(messages, events):
                    await pub.publish_raw(topics[m.topic], m.key, value_of(m, ev, int(time.time() * 1000)))
                await pub.flush()
        self.published += len(messages)
        return len(messages), time.monotonic() - t0

    def memory(self, mark: str | None = None) -> int:
        """The worker's RSS now (bytes); with ``mark``, pymalloc's figures go to ``self.malloc[mark]`` first."""
        if mark is not None:
            self.malloc[mark] = self.worker.malloc_stats()
        assert self.worker.proc is not None
        return rss_kb(self.worker.proc.pid).get("VmRSS", 0) * 1024

    def runs_held(self) -> float:
        return _sum(self.worker.metrics().get("loopwarden_runs", []), "loopwarden_runs")

    def _ingested(self) -> bool:
        samples = self.worker.metrics()
        self.samples = samples
        events = samples.get("loopwarden_events", [])
        consumed = (_sum(events, "loopwarden_events_total", topic="steps")
                    + _sum(events, "loopwarden_events_total", topic="outcomes")
                    + _sum(samples.get("loopwarden_invalid_events", []), "loopwarden_invalid_events_total"))
        emitted = _sum(samples.get("loopwarden_transitions", []), "loopwarden_transitions_total")
        return consumed >= self.published and self.collector.count >= emitted

    async def wait_ingested(self) -> dict[str, list[tuple[float, float]]]:
        """Wait until every published message is consumed and its transitions are on agent.health."""
        if not await _wait(self._ingested, timeout_s=900, every_s=0.5):  # /metrics costs the worker CPU
            raise TimeoutError(f"worker did not consume {self.published} messages in time; see {self.worker.log}")
        return {k: buckets(self.samples.get(name, []), name) for k, name in HISTOGRAMS.items()}

    async def measure(self, runs: int, paced_runs: int, pace_eps: float, seed: int, more: int = 0) -> dict:
        assert self.worker.proc is not None
        pid = self.worker.proc.pid
        res: dict = {"rss_before": self.memory()}
        task = asyncio.create_task(self.collector.run())

        # Paced below capacity: the histogram then shows the pipeline's delay, not a backlog.
        n_paced, t_paced = await self.publish(paced_runs, seed + 1000, pace_eps)
        paced = await self.wait_ingested()
        await asyncio.sleep(TRIM_WAIT_S)
        res.update(rss_paced=self.memory("paced"), runs_paced=self.runs_held())
        res.update(paced_n=n_paced, paced_eps=n_paced / t_paced, paced_p50=quantile(0.5, paced["event"]),
                   paced_p99=quantile(0.99, paced["event"]), paced_timer_p50=quantile(0.5, paced["timer"]),
                   paced_timer_p99=quantile(0.99, paced["timer"]), paced_txn_p50=quantile(0.5, paced["txn"]),
                   paced_txn_p99=quantile(0.99, paced["txn"]))

        # A first backlog of the same size, before the measured one: the memory per run is read between the
        # two (both marks after a backlog): the first backlog's marginal also carries what the allocator keeps
        # of the backlog itself (pymalloc arenas pinned by runs allocated among the buffered records).
        await self.publish(runs, seed + 2000, None)
        warm = (await self.wait_ingested())["event"]
        await asyncio.sleep(TRIM_WAIT_S)
        res.update(rss_warm=self.memory("warm"), runs_warm=self.runs_held())

        # As fast as the producer goes: throughput, and latency under a backlog.
        cpu0, broker0, self0 = self.worker.cpu_s(), cpu_s(self.broker_pid), cpu_s(os.getpid())
        t0 = time.monotonic()
        n, t_published = await self.publish(runs, seed, None)
        fast = _minus((await self.wait_ingested())["event"], warm)
        res.update(
            messages=n, publish_s=t_published, ingest_s=self.collector.last_arrival - t0,
            cpu_ingest_s=self.worker.cpu_s() - cpu0, cpu_broker_s=cpu_s(self.broker_pid) - broker0,
            cpu_bench_s=cpu_s(os.getpid()) - self0, p50=quantile(0.5, fast), p99=quantile(0.99, fast),
        )
        await asyncio.sleep(TRIM_WAIT_S)
        res.update(rss_ingest=self.memory("ingest"), runs_ingest=self.runs_held())
        # Further backlogs of the same size: more marks for the RSS slope (memory only; their time is not end to end's).
        t_more = time.monotonic()
        for j in range(more):
            await self.publish(runs, seed + 3000 + j, None)
            await self.wait_ingested()
            await asyncio.sleep(TRIM_WAIT_S)
            res.update({f"rss_more{j}": self.memory(f"more{j}"), f"runs_more{j}": self.runs_held()})
        t_more = time.monotonic() - t_more

        # The same stamped bytes through offline replay: the expected states, and the replay rate.
        replay = Replay(keep_final=True)
        t_r = time.perf_counter()
        replayed: list = []
        for v in self.stamped:
            replayed += replay.feed(decode_input(v))
        res["replay_s"] = time.perf_counter() - t_r
        res["valid"] = len(self.stamped)
        replayed += replay.finish(ADVANCE_S)
        res["replay_transitions"] = len(replayed)
        replay_paths: dict[str, list[str]] = {}
        for t in replayed:
            replay_paths.setdefault(t.run_id, []).append(t.to_state)
        expected = {run_id: t.to_state for run_id, t in replay.final.items()}

        now_ms = self.last_ts + int(ADVANCE_S * 1000)
        async with Publisher(self.config.bootstrap) as pub:
            for p in range(self.config.partitions):
                await pub.publish_raw(self.config.ticks_topic, None, encode_tick(Tick(now_ms=now_ms)), partition=p,
                                      wait=True)
        latest = self.collector.latest

        def settled() -> bool:
            return all(latest.get(r, (0, None))[1] == s for r, s in expected.items())

        res["matched"] = await _wait(settled, timeout_s=120, every_s=0.1)
        res["e2e_s"] = self.collector.last_arrival - t0 - t_more
        await asyncio.sleep(1.0)  # let stragglers (if any) arrive before counting
        self.collector.stop()
        await task
        mem = rss_kb(pid)
        res.update(
            mismatched=sum(1 for r, s in expected.items() if latest.get(r, (0, None))[1] != s),
            transitions=self.collector.count, runs_total=len(expected),
            # Final states equal, paths may not: the worker folds what each batch holds of the two
            # input topics in ts order, replay the whole stream.
            path_diffs=_path_diffs(replay_paths, self.collector.paths),
            rss_after=mem.get("VmRSS", 0) * 1024, hwm=mem.get("VmHWM", 0) * 1024, malloc=self.malloc,
        )
        return res


# Backlogs after the measured one, each a mark more for the RSS slope: read over 60,000 runs, not 20,000, the
# difference between two backlogs' peaks (pymalloc keeps its high-water arenas) weighs a third as much.
MEMORY_MORE = 2


def processor_e2e(report: Report, workdir: Path, runs: int, rounds: int, partitions: int,
                  paced_runs: int, pace_eps: float, more: int = MEMORY_MORE) -> None:
    bench = "c kafka"
    progress("[c] starting a local Kafka broker (KRaft) ...")
    t = time.monotonic()
    kafka = start_broker(workdir / "kafka")
    progress(f"[c] broker ready on {kafka.bootstrap} in {time.monotonic() - t:.0f}s")
    results = []
    try:
        for i in range(rounds):
            progress(f"[c] round {i + 1}/{rounds}: worker + {runs:,} runs published as fast as possible ...")
            rdir = workdir / f"round-{i}"
            rdir.mkdir(parents=True, exist_ok=True)
            res = asyncio.run(one_round(kafka.bootstrap, runs, paced_runs, pace_eps, partitions, rdir,
                                        seed=7 + i, broker_pid=kafka.pid, more=more))
            progress(f"[c]   ingest {res['ingest_s']:.1f}s, end to end {res['e2e_s']:.1f}s, "
                     f"mismatched runs {res['mismatched']}")
            results.append(res)
    finally:
        kafka.stop()

    def med(key: str) -> float:
        return median([r[key] for r in results])

    n, valid, r0 = results[0]["messages"], results[0]["valid"], results[0]
    ingest_eps, replay_eps = n / med("ingest_s"), valid / med("replay_s")
    report.add(bench, f"messages published fast ({runs:,} runs)", f"{n:,}",
               f"median of {len(results)}; 1 worker, {partitions} partitions, clock=event")
    report.add(bench, "publish (producer side)", si(n / med("publish_s"), "msg/s"), duration(med("publish_s")))
    report.add(bench, "processor ingest: 1st publish -> last transition", si(ingest_eps, "ev/s"),
               duration(med("ingest_s")))
    report.add(bench, "  worker CPU per event", duration(med("cpu_ingest_s") / n),
               si(n / med("cpu_ingest_s"), "ev") + " per worker CPU-s")
    report.add(bench, "  CPU-s in ingest: worker / broker / bench",
               f"{med('cpu_ingest_s'):.1f} / {med('cpu_broker_s'):.1f} / {med('cpu_bench_s'):.1f}",
               f"of {med('ingest_s'):.1f} s wall x {os.cpu_count()} cores")
    report.add(bench, "end to end incl. final tick", si(n / med("e2e_s"), "ev/s"),
               f"{duration(med('e2e_s'))}; every run as replay: {all(r['matched'] for r in results)}; the tick times "
               f"out all {r0['runs_total']:,} runs held, the {more} backlogs after the measured one included (memory rows)")
    report.add(bench, "replay on the same stamped events", si(replay_eps, "ev/s"),
               f"{valid:,} events in {duration(med('replay_s'))}")
    report.add(bench, "ratio processor:replay (ev/s)", f"1:{replay_eps / ingest_eps:.0f}", "ingest rate vs replay rate")
    report.add(bench, "event->transition p50 / p99, backlog", f"{duration(med('p50'))} / {duration(med('p99'))}",
               "fast phase; histogram buckets, interpolated")
    report.add(bench, f"event->transition p50 / p99, paced at {si(med('paced_eps'), 'ev/s')}",
               f"{duration(med('paced_p50'))} / {duration(med('paced_p99'))}",
               f"histogram buckets; the latency target is read in bench g (raw samples; asked {si(pace_eps, 'ev/s')}); "
               f"{r0['paced_n']:,} messages paced, then a first backlog of {runs:,} runs before the measured one")
    report.add(bench, "  a transaction, begin -> commit, p50 / p99 (paced)",
               f"{duration(med('paced_txn_p50'))} / {duration(med('paced_txn_p99'))}",
               "AddPartitionsToTxn, Produce, EndTxn in sequence; a partition commits one at a time")
    report.add(bench, "  timer deadline -> transition p50 / p99 (paced)",
               f"{duration(med('paced_timer_p50'))} / {duration(med('paced_timer_p99'))}",
               "not in the event latency above: bounded by the tick interval (1 s)")
    report.add(bench, "transitions on agent.health / replay", f"{r0['transitions']:,} / {r0['replay_transitions']:,}",
               f"runs not in replay's final state: {max(r['mismatched'] for r in results)} of {r0['runs_total']:,}")
    diffs = [d for r in results for d in r["path_diffs"]]
    example = ""
    if diffs:
        run_id, got, want = diffs[0]
        example = f"; e.g. {run_id}: worker {' > '.join(got)}, replay {' > '.join(want)}"
    # Which of a run's run_ended and receipt each side applied first: without VERIFYING, the receipt.
    receipt_first = sum("VERIFYING" not in got and "VERIFYING" in want for _r, got, want in diffs)
    step_first = sum("VERIFYING" in got and "VERIFYING" not in want for _r, got, want in diffs)
    report.add(bench, "runs whose path (not final state) differs from replay's", f"{len(diffs):,}",
               f"over {len(results)} round(s){example}; {receipt_first} where the worker applied the receipt first "
               f"(its run_ended, sent just before it to the other topic, not yet in a fetch: no processor waits for a "
               f"record it has no sign of), {step_first} where it applied the run_ended first (one ms, sent "
               f"receipt first: the worker applies a tie step first, docs/contract.md section 5, replay in send "
               f"order), {len(diffs) - receipt_first - step_first} other")
    report.add(bench, "worker RSS ready -> ingested -> end",
               f"{nbytes(med('rss_before'))} -> {nbytes(med('rss_ingest'))} -> {nbytes(med('rss_after'))}",
               f"peak {nbytes(med('hwm'))}; +{nbytes((med('rss_after') - med('rss_before')) / r0['runs_total'])}/run "
               f"(average: includes the Kafka clients' buffers, which do not grow with runs); malloc_trim every 1 s")
    def per_run(key: str, a: str, b: str) -> list[float]:
        return [(r[f"{key}_{b}"] - r[f"{key}_{a}"]) / max(r[f"runs_{b}"] - r[f"runs_{a}"], 1) for r in results]

    for r in results:  # pymalloc's figures at the marks (bench/probe), as rss_* / runs_* are
        for mark in ("paced", "warm", "ingest"):
            m = r["malloc"].get(mark, {})
            r[f"alloc_{mark}"] = m.get("bytes in allocated blocks", 0)
            r[f"arenas_{mark}"] = m.get("arenas allocated current", 0) * 2**20
    rows = per_run("rss", "warm", "ingest")
    figures = [per_run_figures(r) for r in results]
    peak = sum(all(m.get("arenas allocated current") == m.get("arenas highwater mark") for m in r["malloc"].values())
               for r in results)
    empty = [(m.get("arenas allocated current", 0) - sum(v[0] for v in m.get("classes", {}).values()) / 64)
             for r in results for m in r["malloc"].values()]
    if all("slope" in f for f in figures):
        slopes = [f["slope"] for f in figures]
        last = max(k for k in r0 if k.startswith("runs_more"))
        report.add(bench, "worker RSS per run held, slope", nbytes(median(slopes)),
                   f"least squares of RSS over runs held at the {more + 2} marks after the first backlog "
                   f"({int(r0['runs_warm']):,} -> {int(r0[last]):,} runs), each after a malloc_trim; rounds "
                   f"{', '.join(nbytes(x) for x in slopes)}; target <= 600 B")
    report.add(bench, "  between two backlogs (the old reading)", nbytes(median(rows)),
               f"(RSS after the measured backlog - after the first one) / runs added ({int(r0['runs_warm']):,} -> "
               f"{int(r0['runs_ingest']):,} runs held); rounds {', '.join(nbytes(x) for x in rows)}: pymalloc never "
               f"gives an arena back here (arenas = their high-water mark at every mark in {peak} of {len(results)} "
               f"rounds; empty pools {min(empty, default=0):.1f}-{max(empty, default=0):.1f} MiB), so it also reads "
               f"how much higher one backlog's buffered records peaked than the other's, / {runs:,} runs")
    alloc, arenas = per_run("alloc", "warm", "ingest"), per_run("arenas", "warm", "ingest")
    report.add(bench, "  of which Python objects (pymalloc, allocated blocks)", nbytes(median(alloc)),
               f"same marks; pymalloc arenas grew {nbytes(median(arenas))}/run (1 MiB each, given back only when "
               f"empty); rounds {', '.join(nbytes(x) for x in alloc)}")
    first, first_arenas = per_run("rss", "paced", "warm"), per_run("arenas", "paced", "warm")
    report.add(bench, "  first backlog: RSS per run, marginal", nbytes(median(first)),
               f"(after the first backlog - after the paced phase) / runs added; arenas {nbytes(median(first_arenas))}"
               f"/run, Python objects {nbytes(median(per_run('alloc', 'paced', 'warm')))}/run: the arenas the backlog's "
               f"buffered records filled stay pinned by the runs allocated among them (the old figure: 224-989 B)")


def per_run_figures(res: dict) -> dict[str, float]:
    """One round's memory figures per run held: RSS, live objects and arenas, between the two backlogs and over the
    first; 'held', the slope (with further backlogs), CPU per event."""
    out = {}
    for a, b, tag in (("warm", "ingest", ""), ("paced", "warm", "first_")):
        runs = max(res[f"runs_{b}"] - res[f"runs_{a}"], 1)
        ma, mb = res["malloc"].get(a, {}), res["malloc"].get(b, {})
        out[f"{tag}rss"] = (res[f"rss_{b}"] - res[f"rss_{a}"]) / runs
        out[f"{tag}alloc"] = (mb.get("bytes in allocated blocks", 0) - ma.get("bytes in allocated blocks", 0)) / runs
        arenas = mb.get("arenas allocated current", 0) - ma.get("arenas allocated current", 0)
        out[f"{tag}arenas"] = arenas * 2**20 / runs
        out[f"{tag}malloc"] = (mb.get("malloc in use", 0) - ma.get("malloc in use", 0)) / runs  # glibc's, live
    # RSS less the arenas' empty pools (kept by pymalloc for reuse: the backlog's peak, not the runs): Python's
    # used pools (16 KiB each) plus everything outside pymalloc, per run added between the two backlogs.
    held = {}
    for mark in ("warm", "ingest"):
        m = res["malloc"].get(mark, {})
        pools = sum(v[0] for v in m.get("classes", {}).values())
        held[mark] = res[f"rss_{mark}"] - m.get("arenas allocated current", 0) * 2**20 + pools * 2**14
    out["held"] = (held["ingest"] - held["warm"]) / max(res["runs_ingest"] - res["runs_warm"], 1)
    marks = ["warm", "ingest", *sorted(k[5:] for k in res if k.startswith("runs_more"))]
    if len(marks) > 2:  # least-squares slope of RSS over runs held, every mark after the first backlog
        xs, ys = [res[f"runs_{m}"] for m in marks], [res[f"rss_{m}"] for m in marks]
        mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
        out["slope"] = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    out["cpu_us"] = res["cpu_ingest_s"] / res["messages"] * 1e6
    out["ingest_eps"] = res["messages"] / res["ingest_s"]
    return out


def ab_main(argv: list[str] | None = None) -> None:
    """Variants of the worker side by side on one broker (A B B A ...), several rounds: bench c's memory figures.

    ``--variant NAME=[PATH:]KEY=VALUE,...``: a worker with these LOOPWARDEN_* settings, running the code of the
    tree at PATH (default this one)."""
    import argparse
    import json
    import tempfile

    ap = argparse.ArgumentParser(prog="python -m bench.kafka", description=ab_main.__doc__)
    ap.add_argument("--variant", action="append", required=True)
    ap.add_argument("--runs", type=int, default=20_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--paced-runs", type=int, default=300)
    ap.add_argument("--pace-eps", type=float, default=5000.0)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--more", type=int, default=0, help="further backlogs after the measured one (RSS slope)")
    ap.add_argument("--out", help="append each round's figures to this JSON-lines file")
    args = ap.parse_args(argv)
    variants: list[tuple[str, Path, dict[str, str]]] = []
    for spec in args.variant:
        name, _, rest = spec.partition("=")
        root = ROOT
        if ":" in rest.split("=", 1)[0]:
            path, _, rest = rest.partition(":")
            root = Path(path).resolve()
        env = dict(kv.split("=", 1) for kv in rest.split(",") if kv)
        variants.append((name, root, env))
    workdir = Path(tempfile.mkdtemp(prefix="bench-kafka-ab-"))
    kafka = start_broker(workdir / "kafka")
    figures: dict[str, list[dict]] = {name: [] for name, _, _ in variants}
    try:
        for i in range(args.rounds):
            order = variants if i % 2 == 0 else variants[::-1]
            for name, root, env in order:
                rdir = workdir / f"round-{i}-{name}"
                rdir.mkdir(parents=True)
                t0 = time.monotonic()
                res = asyncio.run(one_round(kafka.bootstrap, args.runs, args.paced_runs, args.pace_eps, args.partitions,
                                            rdir, seed=7 + i, broker_pid=kafka.pid, env=env, root=root,
                                            more=args.more))
                f = per_run_figures(res)
                f.update(round=i, variant=name, mismatched=res["mismatched"], wall_s=time.monotonic() - t0,
                         load=os.getloadavg()[0])
                figures[name].append(f)
                progress(f"[ab] round {i} {name}: RSS {f['rss']:.0f} B/run (objects {f['alloc']:.0f}, arenas "
                         f"{f['arenas']:.0f}, held {f['held']:.0f}, slope {f.get('slope', float('nan')):.0f}); "
                         f"first backlog {f['first_rss']:.0f} (arenas {f['first_arenas']:.0f}); "
                         f"CPU {f['cpu_us']:.2f} µs/event; mismatched {f['mismatched']}; {f['wall_s']:.0f} s, "
                         f"load {f['load']:.1f}")
                if args.out:
                    with open(args.out, "a") as fh:
                        fh.write(json.dumps(f) + "\n")
    finally:
        kafka.stop()
    for name, rows in figures.items():
        if not rows:
            continue
        cols = ("rss", "held", "slope", "alloc", "arenas", "malloc", "first_rss", "first_arenas", "cpu_us")
        each = {c: f"{median([r[c] for r in rows]):.1f} ({'/'.join(f'{r[c]:.0f}' for r in rows)})"
                for c in cols if all(c in r for r in rows)}
        print(f"{name}: " + ", ".join(f"{c} {v}" for c, v in each.items()))


if __name__ == "__main__":
    ab_main()
