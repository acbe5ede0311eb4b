"""A second stage on the engine, in a few dozen lines: counts messages per key.

For every input record it produces ``<count> <input partition>:<offset>`` keyed by the
record's key to the output topic (the default partitioner over that topic's own
partition count), and keeps each key's count in its changelog: the engine commits
outputs, changelog and offsets in one transaction per batch. ``python -m
tests.engine.counter_stage`` runs it (config from ``LOOPWARDEN_*``; topics from
``COUNTER_IN`` and ``COUNTER_OUT``) until SIGTERM.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Mapping

from loopwarden.engine.stage import DeadLetter, Folded, Input, Output, StageBase, TaskBase


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
    config = from_env()
    engine = Engine(config, CounterStage(os.environ["COUNTER_IN"], os.environ["COUNTER_OUT"], config.app_id))

    async def run() -> None:
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, engine.stop)
        await engine.run()

    asyncio.run(run())


if __name__ == "__main__":
    main()
