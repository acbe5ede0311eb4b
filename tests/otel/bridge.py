"""Drive the bridge stage without Kafka (a dict store committed like the engine would) and replay its events."""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field

from loopwarden.codecs import RunStarted, decode_input
from loopwarden.stages.otel import Limits
from loopwarden.stages.otel.task import BridgeTask, Folded
from loopwarden.replay import Replay


@dataclass
class Rec:
    """A consumed record, as aiokafka's ConsumerRecord offers it."""

    value: bytes | None
    offset: int = 0
    key: bytes | None = None
    topic: str = "otlp_spans"
    partition: int = 0
    headers: tuple = ()


@dataclass
class Bridge:
    """A BridgeTask over a dict store; every fold is committed (or discarded) like the engine does."""

    # the processing clock: now, unless a test moves it (hand-made spans are stamped in the past)
    now_ms: int = field(default_factory=lambda: int(time.time() * 1000))
    store: dict = field(default_factory=dict)
    offset: int = 0
    counts: Counter = field(default_factory=Counter)
    outputs: list = field(default_factory=list)
    deadletters: list = field(default_factory=list)

    def __post_init__(self) -> None:
        self.task = self.new_task()

    def new_task(self, limits: Limits = Limits(end_grace_s=0), **kw) -> BridgeTask:
        """A task over the committed store (no end grace unless asked: most tests look at one fold)."""
        task = BridgeTask(0, self.store, steps_topic="agent.steps", wall_ms=lambda: self.now_ms, limits=limits, **kw)
        task.rebuild()
        return task

    def fold(self, values: list[bytes | None], *, punctuate: bool = False, commit: bool = True,
             headers: tuple = ()) -> Folded:
        recs = []
        for v in values:
            recs.append(Rec(v, self.offset, headers=headers))
            self.offset += 1
        out = self.task.fold(recs, punctuate=punctuate)
        if not commit:
            self.task.discard()
            return out
        self.commit(out)
        return out

    def commit(self, out: Folded) -> None:
        """What the engine does once ``out``'s transaction committed: the store takes its changes."""
        for key, raw in out.changes.items():
            if raw is None:
                self.store.pop(key, None)
            else:
                self.store[key] = raw
        self.task.committed(out)
        self.counts.update(out.counts)
        self.outputs += out.outputs
        self.deadletters += out.deadletters

    def events(self) -> list:
        return [decode_input(o.value) for o in self.outputs]


def replay(events: list, advance_s: float = 0.0) -> Replay:
    """The events through offline replay (the worker's rules), keeping every run's last transition."""
    r = Replay(keep_final=True)
    for event in events:
        r.feed(event)
    r.finish(advance_s)
    return r


def in_memory(hooked: bool = False):
    """(a tracer provider, its in-memory exporter): each span exported as it ends, through the producer hook's
    ``RunSpans`` when ``hooked``."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from loopwarden.stages.otel import hook

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    processor = SimpleSpanProcessor(exporter)
    provider.add_span_processor(hook.RunSpans(processor) if hooked else processor)
    return provider, exporter


def one_per_span(spans) -> list[bytes]:
    """Each SDK span its own OTLP message, as the exporter would send them ended one by one (the hardest split:
    a cancelled tool's span ends after its run's)."""
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

    return [encode_spans([s]).SerializeToString() for s in spans]


def through_bridge(messages: list[bytes], after_ms: int = 2000) -> Bridge:
    """``messages`` through a bridge with a 2 s end grace, then its punctuation ``after_ms`` later."""
    b = Bridge()
    b.task = b.new_task(limits=Limits(end_grace_s=2))
    b.fold(messages)
    b.now_ms += after_ms
    b.fold([], punctuate=True)
    return b


def compared(got: dict, expected: dict) -> dict:
    """``got`` (agent -> (state, reason)) read as ``expected`` is written: the reason only where it names one."""
    return {agent: (got[agent][0], got[agent][1] if reason is not None else None) if agent in got else None
            for agent, (_state, reason) in expected.items()}


def final_by_agent(events: list, advance_s: float = 0.0) -> dict[str, tuple[str, str]]:
    """Each run's last transition (state, reason) after replay, keyed by its run_started agent."""
    agents = {e.run_id: e.agent for e in events if isinstance(e, RunStarted)}
    return {agents[run]: (t.to_state, t.reason) for run, t in replay(events, advance_s).final.items()}
