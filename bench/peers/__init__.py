"""Peer stream apps for bench/ingest.py, each run as ``python -m bench.peers.<name>`` in a subprocess.

Configured by environment (set by bench/ingest.py): PEER_BROKER, PEER_GROUP,
PEER_STEPS, PEER_OUTCOMES, PEER_OUTPUT, PEER_STATE_DIR, PEER_READY_FILE. Each app
writes PEER_READY_FILE (its monotonic time and CPU seconds, as JSON) when it handles
its first message, so the bench can time ingest from there.
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
