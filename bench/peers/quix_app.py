"""Quix Streams peer: a per-run count (State per key) and one output message per input, exactly-once.

What a user would write for "count each run's events": both input topics (JSON values,
keyed by run id) concatenated into one StreamingDataFrame, a stateful apply keeping
the run's count in its RocksDB state, and every result sent to the output topic.
Exactly-once; the commit interval is Quix's own default (5 s in 3.28) unless
PEER_COMMIT_INTERVAL sets it (the bench's second row: 1 s, as the worker commits).
"""

from __future__ import annotations

import os

from quixstreams import Application

from bench.peers import Progress

env = os.environ
# Only what the bench sets; everything else at Quix's defaults.
options = {"commit_interval": float(env["PEER_COMMIT_INTERVAL"])} if env.get("PEER_COMMIT_INTERVAL") else {}
app = Application(
    broker_address=env["PEER_BROKER"],
    consumer_group=env["PEER_GROUP"],
    auto_offset_reset="earliest",
    processing_guarantee="exactly-once",
    state_dir=env["PEER_STATE_DIR"],
    loglevel=env.get("PEER_LOGLEVEL", "WARNING"),
    **options,
)
steps = app.topic(env["PEER_STEPS"])
outcomes = app.topic(env["PEER_OUTCOMES"])
output = app.topic(env["PEER_OUTPUT"])

progress = Progress()


def count(value: dict, state) -> dict:
    progress.tick()
    n = state.get("n", 0) + 1
    state.set("n", n)
    return {"type": value["type"], "n": n}


sdf = app.dataframe(steps).concat(app.dataframe(outcomes))
sdf = sdf.apply(count, stateful=True)
sdf.to_topic(output)

if __name__ == "__main__":
    app.run()
