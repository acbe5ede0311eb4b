"""Benches a and b: the pure core through offline replay, and the size of a run's state.

a. events/s of ``decode_input`` alone, of ``Replay.feed`` on decoded events, and of
   both together, so the decode share shows where the time goes; and of the stream
   processor's per-message path (``Processor.on_message`` on a dict, no Kafka), with and
   without its Prometheus bookkeeping;
b. bytes of a run's state as ``encode_state`` makes them (what the stream processor's
   store holds per run), over a fleet's states and for one run of 10,000 steps; the heap
   a store {run id: encoded state} holds per run, and the Python heap a Replay holds
   per 10k runs (tracemalloc).
"""

from __future__ import annotations

import gc
import importlib
import sys
import time
import tracemalloc

import msgspec

from bench.common import Report, duration, median, nbytes, progress, si, timed
from loopwarden import gctune
from loopwarden.codecs import InputEvent, Policy, RunStarted, StepFinished, ToolCall, Usage, decode_input
from loopwarden.codecs.events import RecoveryPolicy
from loopwarden.replay import Replay
from loopwarden.rules import apply, decode_state, encode_state
from loopwarden.simulate import fleet


def valid_messages(runs: int, seed: int = 7) -> list:
    return [m for m in fleet(runs, seed=seed) if m.valid]


class _Rec:
    __slots__ = ("topic", "partition", "offset", "key", "value", "headers")

    def __init__(self, topic, partition, offset, key, value) -> None:
        self.topic, self.partition, self.offset, self.key, self.value, self.headers = \
            topic, partition, offset, key, value, ()


def by_partition(messages: list, partitions: int = 8) -> dict[int, list]:
    """The fleet's records of ``partitions`` partitions, offsets numbered per topic partition, as a consumer hands them."""
    next_offset: dict = {}
    out: dict[int, list] = {}
    for m in messages:
        partition = hash(m.key) % partitions
        offset = next_offset.get((m.topic, partition), 0)
        next_offset[m.topic, partition] = offset + 1
        out.setdefault(partition, []).append(_Rec(m.topic, partition, offset, m.key, m.value))
    return out


def backlog_order(part: list, chunk: int = 500) -> list:
    """A partition's records as a consumer hands a backlog over: each topic's in turn, ``chunk`` at a time (its
    fetches), not interleaved by ts. A topic read ahead moves the clock, and the other's changes are then stamped
    at one clock value: thousands of runs share their next deadline (what made ``TimerQueue.held`` scan 1,100 keys a
    call in bench e; the ts order hides it)."""
    by_topic: dict[str, list] = {}
    for r in part:
        by_topic.setdefault(r.topic, []).append(r)
    out: list = []
    for i in range(0, max(map(len, by_topic.values()), default=0), chunk):
        for records in by_topic.values():
            out += records[i:i + chunk]
    return out


def variants(pkg: str, values: list, records: dict[int, list]) -> dict:
    """The core's variants, each a no-argument call, over ``pkg`` (``loopwarden``, or another revision of it
    imported under another name: bench/core_ab.py): ``decode_input`` alone, ``Replay.feed`` on decoded events,
    both (= offline replay), and the worker's path without Kafka: records of each partition in batches, folded by
    the partition's task, changes written to its store as after a commit, and the metrics the health stage
    records from each commit (``HealthStage.committed``, as the engine calls it), or not."""
    mod = lambda name: importlib.import_module(f"{pkg}.{name}")  # noqa: E731
    decode_input, Replay = mod("codecs").decode_input, mod("replay").Replay
    Settings, MemoryPartition = mod("rules").Settings, mod("engine.store").MemoryPartition
    PartitionTask, HealthStage = mod("stages.health.task").PartitionTask, mod("stages.health.stage").HealthStage
    try:  # the process's Config and the stage's own metrics class
        Config, EngineMetrics = mod("config").Config, mod("engine.metrics").EngineMetrics
        HealthMetrics = mod("stages.health.metrics").HealthMetrics
    except ModuleNotFoundError:  # a revision with one Config and one Metrics, both in the engine (core_ab.py)
        Config, HealthMetrics = mod("engine.config").Config, mod("engine.metrics").Metrics
        EngineMetrics = None
    decoded = [decode_input(v) for v in values]

    def decode() -> None:
        for v in values:
            decode_input(v)

    def feed() -> None:
        r = Replay()
        for ev in decoded:
            r.feed(ev)

    def replay() -> None:
        r = Replay()
        for v in values:
            r.feed(decode_input(v))

    backlog = {p: backlog_order(part) for p, part in records.items()}

    def fold(batch: int, metrics: bool = True, order: dict[int, list] = records):
        def go() -> None:
            stage = HealthStage(Config(), HealthMetrics(EngineMetrics()) if EngineMetrics else HealthMetrics())
            roles = {"steps": "steps", "outcomes": "outcomes", "ticks": "ticks"}
            for p, part in order.items():
                task = PartitionTask(p, MemoryPartition(), roles, settings=Settings(), clock="event")
                for i in range(0, len(part), batch):
                    out = task.fold(part[i:i + batch], punctuate=True)
                    task.store.write(out.changes, None)
                    summary = task.committed(out)
                    if metrics:
                        stage.committed(p, task, out, summary)
        return go

    return {"decode": decode, "feed": feed, "replay": replay, "fold2500": fold(2500),
            "fold2500_nometrics": fold(2500, False), "fold300": fold(300), "fold50": fold(50),
            "fold2500_backlog": fold(2500, order=backlog)}


def throughput(report: Report, runs: int, repeats: int) -> dict:
    progress(f"[a] core throughput: simulating {runs:,} runs ...")
    messages = valid_messages(runs)
    values = [m.value for m in messages]
    n = len(values)
    every = variants("loopwarden", values, by_partition(messages))
    bare = msgspec.json.Decoder(InputEvent).decode  # msgspec alone: no content-type, size or bytes checks

    def bare_decode() -> None:
        for v in values:
            bare(v)

    variants_run = {
        "decode": every["decode"],
        "bare": bare_decode,
        "feed": every["feed"],
        "total": every["replay"],
        "fold": every["fold2500"],
        "fold_nometrics": every["fold2500_nometrics"],
        "fold_small": every["fold50"],
        "fold_backlog": every["fold2500_backlog"],
    }
    times: dict[str, list[float]] = {k: [] for k in variants_run}
    cpu: dict[str, list[float]] = {k: [] for k in variants_run}
    # As the shells run: the collector settings the CLI's replay and the worker set, and the
    # bench's own inputs (~130k fixture objects the CLI never holds: it streams its lines)
    # frozen, so no collection walks them on every variant's behalf.
    gc.collect()
    gc.freeze()
    before = gctune.for_streaming()
    try:
        for _ in range(repeats):  # round-robin, so machine noise hits every variant alike
            for name, fn in variants_run.items():
                gc.collect()
                c0 = time.process_time()
                times[name].append(timed(fn))
                cpu[name].append(time.process_time() - c0)
    finally:
        gc.set_threshold(*before)
        gc.unfreeze()
    t = {k: median(v) for k, v in times.items()}
    c = {k: median(v) for k, v in cpu.items()}
    bench = "a core"
    report.add(bench, f"events (valid, {runs:,} runs)", f"{n:,}",
               f"median of {repeats}; collector as the shells set it ({'/'.join(map(str, gctune.THRESHOLDS))}), inputs frozen")
    report.add(bench, "decode_input only", si(n / t["decode"], "ev/s"), duration(t["decode"] / n) + "/event")
    report.add(bench, "Replay.feed only (pre-decoded)", si(n / t["feed"], "ev/s"), duration(t["feed"] / n) + "/event")
    report.add(bench, "replay: decode + Replay.feed", si(n / t["total"], "ev/s"), duration(t["total"] / n) + "/event")
    report.add(bench, "decode share of replay time", f"{t['decode'] / t['total']:.0%}",
               f"decode:total = 1:{t['total'] / t['decode']:.1f}")
    ratio = t["decode"] / t["total"]  # three digits: 0.197 printed as 0.20 would read as met
    report.add(bench, "ratio replay : decode-only (ev/s)", f"{ratio:.3f}",
               f"target >= 0.2: {'met' if ratio >= 0.2 else 'not met'}; decode-only = decode_input, as replay decodes")
    report.add(bench, "  the same against bare msgspec decode", f"{t['bare'] / t['total']:.2f}",
               f"msgspec.json.Decoder(InputEvent) alone: {si(n / t['bare'], 'ev/s')}, {duration(t['bare'] / n)}/event")
    report.add(bench, "worker fold (PartitionTask), batches of 2,500", si(n / t["fold"], "ev/s"),
               f"{t['fold'] / t['total']:.2f}x replay time; store writes and metrics per batch")
    report.add(bench, "  same, metrics left out", si(n / t["fold_nometrics"], "ev/s"),
               f"metrics = {1 - t['fold_nometrics'] / t['fold']:.0%} of fold time")
    report.add(bench, "  same, batches of 50", si(n / t["fold_small"], "ev/s"),
               f"{t['fold_small'] / t['fold']:.2f}x the time of batches of 2,500")
    report.add(bench, "  same, in a backlog's order (each topic's records in chunks of 500)",
               si(n / t["fold_backlog"], "ev/s"),
               f"{t['fold_backlog'] / t['fold']:.2f}x the time of ts order (as bench e's worker reads its backlog)")
    report.add(bench, "CPU per event: decode_input / Replay.feed / replay", " / ".join(
        duration(c[k] / n) for k in ("decode", "feed", "total")),
        f"process_time, median of {repeats}; replay : decode-only by CPU {c['decode'] / c['total']:.3f}")
    report.add(bench, "CPU per event: worker fold, batches of 2,500 / of 50", " / ".join(
        duration(c[k] / n) for k in ("fold", "fold_small")),
        f"process_time; metrics (HealthStage.committed) {duration((c['fold'] - c['fold_nometrics']) / n)}/event")
    return {"events": n, "replay_eps": n / t["total"]}


def _state_after_steps(n_steps: int):
    state = apply(None, RunStarted(run_id="long-run", ts=0, agent="a", policy=Policy(version="v", stop_when=())), 0).state
    r = Replay()
    r.feed(RunStarted(run_id="long-run", ts=0, agent="a", policy=Policy(version="v", stop_when=())))
    for i in range(n_steps):
        ev = StepFinished(run_id="long-run", ts=i, step=i, finish_reason="tool-calls",
                          tool_calls=(ToolCall(id=f"tc-{i}", name="lookup", status="result"),),
                          usage=Usage(total_tokens=100))
        state = apply(state, ev, i).state
        r.feed(ev)
    return state, len(r._timers)  # noqa: SLF001 - the heap's length is the figure


def _store_bytes_per_run(states: list) -> tuple[float, float]:
    """Heap bytes per run of a store as the stream processor keeps it: {run id bytes: encoded state}.

    Measured with tracemalloc around building the dict (keys, values and the dict's
    own table); returns (all-in bytes/run, of which the encoded states' bytes objects).
    """
    pairs = [(s.run_id, s) for s in states]
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    store = {run_id.encode(): encode_state(state) for run_id, state in pairs}
    held = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    values = sum(sys.getsizeof(v) for v in store.values())
    return held / len(store), values / len(store)


def state_size(report: Report, runs: int, heap_runs: int) -> None:
    bench = "b state"
    progress(f"[b] state size: {runs:,} runs ...")
    values = [m.value for m in valid_messages(runs)]
    r = Replay()
    for v in values:
        r.feed(decode_input(v))
    states = list(r.states.values())
    sizes = sorted(len(encode_state(s)) for s in states)
    plain = sorted(len(msgspec.msgpack.encode(s)) for s in states)
    report.add(bench, f"encode_state bytes, median ({len(sizes):,} runs)", nbytes(median(sizes)),
               f"p99 {nbytes(sizes[int(len(sizes) * 0.99) - 1])}; plain msgpack RunState median {nbytes(median(plain))}")
    report.add(bench, "encode_state bytes, max", nbytes(sizes[-1]), f"plain msgpack RunState max {nbytes(plain[-1])}")
    from bench.ingest import RECOVERY_POLICY  # bench e's default policy for every agent
    defaults = {agent: msgspec.convert(p, RecoveryPolicy) for agent, p in RECOVERY_POLICY.items()}
    rec = Replay(recovery_defaults=defaults)
    for v in values:
        rec.feed(decode_input(v))
    with_policy = sorted(len(encode_state(s)) for s in rec.states.values())
    report.add(bench, "encode_state bytes, median, a recovery policy on every run", nbytes(median(with_policy)),
               f"bench e's RECOVERY_POLICY as every agent's default; p99 {nbytes(with_policy[int(len(with_policy) * 0.99) - 1])}")
    for steps in (10, 10_000):
        state, heap_entries = _state_after_steps(steps)
        report.add(bench, f"encode_state bytes, one run of {steps:,} steps", nbytes(len(encode_state(state))),
                   f"plain msgpack {nbytes(len(msgspec.msgpack.encode(state)))}; Replay timer heap: {heap_entries:,} entries")
    per_run, values = _store_bytes_per_run(states)
    report.add(bench, "memory store bytes/run", nbytes(per_run),
               f"dict {{run id bytes: encode_state}} of {len(states):,} runs (tracemalloc); "
               f"of which encoded-state bytes objects {nbytes(values)}")
    t_enc = timed(lambda: [encode_state(s) for s in states])
    blobs = [encode_state(s) for s in states]
    rids = [s.run_id for s in states]
    t_dec = timed(lambda: [decode_state(b, r) for b, r in zip(blobs, rids)])
    report.add(bench, "encode_state / decode_state", f"{duration(t_enc / len(states))} / {duration(t_dec / len(states))}",
               "per state")

    progress(f"[b] Python heap of a Replay holding {heap_runs:,} runs (tracemalloc) ...")
    events = [decode_input(v) for v in [m.value for m in valid_messages(heap_runs, seed=11)]]
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    r = Replay()
    for ev in events:
        r.feed(ev)
    gc.collect()
    held = tracemalloc.get_traced_memory()[0] - base
    timers = len(r._timers)  # noqa: SLF001
    r.final.clear()
    r._timers.clear()  # noqa: SLF001
    r.notes.clear()
    gc.collect()
    states_only = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    scale = 10_000 / len(r.states)
    report.add(bench, "Replay heap per 10k runs (all)", nbytes(held * scale),
               f"{nbytes(held / len(r.states))}/run; timer heap {timers:,} entries for {len(r.states):,} runs")
    report.add(bench, "  of which RunState objects per 10k runs", nbytes(states_only * scale),
               f"{nbytes(states_only / len(r.states))}/run")
