"""Minimal Faust agent (faust-streaming): reads both input topics as raw bytes and does nothing per event.

The floor of any Faust-based worker: Faust's consumer, stream and acking machinery
with no decode, no table and no output.
"""

from __future__ import annotations

import os
import sys

import faust

from bench.peers import Progress

env = os.environ
app = faust.App(
    env["PEER_GROUP"],
    broker=f"kafka://{env['PEER_BROKER']}",
    store="memory://",
    autodiscover=False,
    web_enabled=False,
    topic_partitions=8,
    consumer_auto_offset_reset="earliest",
    broker_commit_interval=1.0,  # as the loopwarden worker: completion is seen at a commit
    datadir=env["PEER_STATE_DIR"],
)
topic = app.topic(env["PEER_STEPS"], env["PEER_OUTCOMES"], key_serializer="raw", value_serializer="raw")


@app.agent(topic)
async def sink(stream):
    progress = Progress()
    async for _ in stream:
        progress.tick()


if __name__ == "__main__":
    sys.argv = [sys.argv[0], "worker", "--without-web", "--loglevel", "warn"]
    app.main()
