"""Drive the bridge stage without Kafka (a dict store committed like the engine would) and replay its events."""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field

from loopwarden.codecs import decode_input
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
