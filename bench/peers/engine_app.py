"""The peers' job on loopwarden's engine: a per-run count and one output message per input, exactly-once.

The same job as the Quix Streams and Kafka Streams peers (quix_app.py, kstreams/): both input topics
(JSON values keyed by run id) co-partitioned, each value decoded, the run's count read from the store
and written back (the changelog), ``{"type", "n"}`` sent to the output topic keyed by run id. It runs
on ``loopwarden.engine.loop.Engine`` with the worker's defaults (memory store, one transaction per
partition's batch, the group's offsets committed after the transactions): what the engine costs on
the peers' job, so that the worker's row splits into the engine and the health rules.

Configured by the bench's PEER_* environment (bench/peers/__init__.py); marks ready and its window
where it handles a message, as the peers do.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Mapping

import msgspec

from bench.peers import Progress
from loopwarden.config import Config
from loopwarden.engine.loop import Engine
from loopwarden.engine.stage import DeadLetter, Folded, Input, Output, StageBase, TaskBase

PARTITIONS = 8
_decode = msgspec.json.decode
_encode = msgspec.json.encode


class CountTask(TaskBase):  # does not align its inputs (the peers do not either): TaskBase's defaults
    def __init__(self, store: Mapping[bytes, bytes], output: str, progress: Progress) -> None:
        self.store, self.output, self.progress = store, output, progress

    def fold(self, records, *, punctuate: bool, caught_up: bool, lagging) -> Folded:
        out = Folded()
        changes, offsets, outputs, store, topic = out.changes, out.offsets, out.outputs, self.store, self.output
        tick = self.progress.tick
        for r in records:
            offsets[r.topic] = r.offset + 1
            tick()
            try:
                kind = _decode(r.value)["type"]
            except (msgspec.DecodeError, KeyError, TypeError) as exc:
                out.deadletters.append(DeadLetter(r, "undecodable", str(exc)))
                continue
            key = r.key
            n = int(changes.get(key) or store.get(key) or b"0") + 1
            changes[key] = b"%d" % n
            outputs.append(Output(topic, key, _encode({"type": kind, "n": n})))
        out.consumed = len(records)
        return out


class CountStage(StageBase[CountTask, Folded]):
    name = "count"
    store_name = "counts"

    def __init__(self, steps: str, outcomes: str, output: str, app_id: str) -> None:
        self.inputs = (Input(steps, "steps"), Input(outcomes, "outcomes"))
        self.outputs = (output,)
        self.keyed_like_input = frozenset({output})  # keyed by run id, as many partitions as the inputs
        self.changelog_topic = f"{app_id}-counts-changelog"
        self.deadletter_topic = f"{app_id}-dead"
        self.progress = Progress()

    def task(self, partition: int, store: Mapping[bytes, bytes]) -> CountTask:
        return CountTask(store, self.outputs[0], self.progress)


async def _topics(config: Config, stage: CountStage) -> None:
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    admin = AIOKafkaAdminClient(bootstrap_servers=config.broker)
    await admin.start()
    try:
        await admin.create_topics([
            NewTopic(stage.changelog_topic, PARTITIONS, 1, topic_configs={"cleanup.policy": "compact"}),
            NewTopic(stage.deadletter_topic, PARTITIONS, 1)])
    finally:
        await admin.close()


def main() -> None:
    import logging

    from loopwarden import gctune

    gctune.for_streaming()  # as the worker's process (loopwarden.cli.set_up_process)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    env = os.environ
    config = Config(broker=env["PEER_BROKER"], app_id=env["PEER_GROUP"], partitions=PARTITIONS)
    stage = CountStage(env["PEER_STEPS"], env["PEER_OUTCOMES"], env["PEER_OUTPUT"], config.app_id)

    async def run() -> None:
        await _topics(config, stage)
        engine = Engine(config, stage)
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, engine.stop)
        await engine.run()

    asyncio.run(run())


if __name__ == "__main__":
    main()
