"""A second stage on the engine, in a few dozen lines: counts messages per key.

For every input record it produces ``<count> <input partition>:<offset>`` keyed by the
record's key to the output topic (the default partitioner over that topic's own
partition count), and keeps each key's count in its changelog: the engine commits
outputs, changelog and offsets in one transaction per batch. Its settings are
:class:`CounterConfig` (the engine's and its two topics, ``LOOPWARDEN_COUNTER_IN`` and
``LOOPWARDEN_COUNTER_OUT``). ``python -m tests.engine.counter_stage`` runs it until SIGTERM.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Mapping
from dataclasses import dataclass

from loopwarden.engine.config import EngineConfig
from loopwarden.engine.stage import DeadLetter, Folded, Input, Output, StageBase, TaskBase


@dataclass(frozen=True)
class CounterConfig(EngineConfig):
    """The engine's knobs and the counter's topics."""

    # Input: the records to count, keyed by what is counted.
    counter_in: str = "counter.in"
    # Output: each record's count so far.
    counter_out: str = "counter.out"

    def topics(self) -> dict[str, str]:
        return {**super().topics(), "counter_in": self.counter_in, "counter_out": self.counter_out}


class CounterTask(TaskBase):  # no alignment, nothing to rebuild or keep beyond the store: TaskBase's defaults
    def __init__(self, store: Mapping[bytes, bytes], out_topic: str) -> None:
        self.store, self.out_topic = store, out_topic

    def fold(self, records, *, punctuate: bool, caught_up: bool, lagging) -> Folded:
        out = Folded()
        for r in records:
            out.offsets[r.topic] = r.offset + 1
            out.consumed += 1
            if not r.key:
                out.deadletters.append(DeadLetter(r, "no_key", "a count needs a key"))
                continue
            n = int(out.changes.get(r.key) or self.store.get(r.key) or b"0") + 1
            out.changes[r.key] = b"%d" % n
            out.outputs.append(Output(self.out_topic, r.key, b"%d %d:%d" % (n, r.partition, r.offset)))
        return out


class CounterStage(StageBase[CounterTask, Folded]):
    name = "counter"
    store_name = "counts"

    def __init__(self, in_topic: str, out_topic: str, app_id: str) -> None:
        self.inputs = (Input(in_topic, "in"),)
        self.outputs = (out_topic,)
        self.changelog_topic = f"{app_id}-counts-changelog"
        self.deadletter_topic = f"{app_id}-dead"

    def task(self, partition: int, store: Mapping[bytes, bytes]) -> CounterTask:
        return CounterTask(store, self.outputs[0])


def main() -> None:
    import logging

    from loopwarden.engine.config import from_env
    from loopwarden.engine.loop import Engine

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    config = from_env(kind=CounterConfig)
    engine = Engine(config, CounterStage(config.counter_in, config.counter_out, config.app_id))

    async def run() -> None:
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, engine.stop)
        await engine.run()

    asyncio.run(run())


if __name__ == "__main__":
    main()
