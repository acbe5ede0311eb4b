"""Peer stream apps for bench/ingest.py, each run as ``python -m bench.peers.<name>`` in a subprocess.

Configured by environment (set by bench/ingest.py): PEER_BROKER, PEER_GROUP,
PEER_STEPS, PEER_OUTCOMES, PEER_OUTPUT, PEER_STATE_DIR, PEER_READY_FILE, PEER_TOTAL,
PEER_PROGRESS_FILE. Each app writes PEER_READY_FILE (its monotonic time and CPU seconds,
as JSON) when it handles its first message, so the bench can time ingest from there,
and appends one JSON line ``{"n", "t", "cpu"}`` to PEER_PROGRESS_FILE when it has
handled 10 % and 90 % of PEER_TOTAL messages: the steady-state window (startup, the
first fetches and the last commit left out). The Kafka Streams peer (kstreams/, Java)
writes the same files; System.nanoTime is CLOCK_MONOTONIC there too.
"""

from __future__ import annotations

import json
import os
import time

from bench.common import cpu_s


def mark_ready() -> None:
    """Write the ready file once: time.monotonic() (system-wide on Linux) and own CPU seconds."""
    path = os.environ["PEER_READY_FILE"]
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump({"t": time.monotonic(), "cpu": cpu_s(os.getpid())}, f)
    os.replace(tmp, path)


class Progress:
    """Counts handled messages; marks ready at the first and the steady-state window at 10 % and 90 %."""

    def __init__(self) -> None:
        total = int(os.environ.get("PEER_TOTAL", "0"))
        self.path = os.environ.get("PEER_PROGRESS_FILE")
        self.marks = [max(1, total // 10), max(1, total * 9 // 10)] if total and self.path else []
        self.seen = 0

    def tick(self) -> None:
        self.seen += 1
        if self.seen == 1:
            mark_ready()
        if self.marks and self.seen == self.marks[0]:
            self.marks.pop(0)
            with open(self.path, "a") as f:
                f.write(json.dumps({"n": self.seen, "t": time.monotonic(), "cpu": cpu_s(os.getpid())}) + "\n")
