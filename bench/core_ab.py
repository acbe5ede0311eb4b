"""The core bench's figures for another revision and this tree, interleaved in one process (CPU per event).

    .venv/bin/python -m bench.core_ab d82b187 [--runs 20000] [--rounds 5] [--only feed,fold2500]

The revision's ``loopwarden`` package is taken with ``git archive`` into a temporary directory
and imported under another name (``lwbase``), so both run in this process on the same records:
each variant of ``bench/core.py`` (decode, feed, replay, the worker's fold with the health
stage's metrics, without them, in batches of 2,500, 300 and 50) one side then the other, the
order alternating each round; medians of the rounds of ``time.process_time()`` per event. On a
shared machine this is the figure to read for a before/after, not two runs of the bench.
"""

from __future__ import annotations

import argparse
import gc
import io
import re
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

from bench.core import by_partition, valid_messages, variants
from loopwarden import gctune

REPO = Path(__file__).resolve().parent.parent


def _import_revision(revision: str, into: Path) -> str:
    data = subprocess.run(["git", "archive", revision, "loopwarden"], cwd=REPO, check=True, capture_output=True).stdout
    tarfile.open(fileobj=io.BytesIO(data)).extractall(into, filter="data")
    (into / "loopwarden").rename(into / "lwbase")
    for path in (into / "lwbase").rglob("*.py"):
        text = path.read_text()
        path.write_text(re.sub(r"\bloopwarden\.", "lwbase.", text).replace("from loopwarden import", "from lwbase import"))
    sys.path.insert(0, str(into))
    return "lwbase"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("revision")
    parser.add_argument("--runs", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--only", default="")
    args = parser.parse_args()
    messages = valid_messages(args.runs)
    values = [m.value for m in messages]
    records = by_partition(messages)
    with tempfile.TemporaryDirectory() as tmp:
        sides = {"before": variants(_import_revision(args.revision, Path(tmp)), values, records),
                 "after": variants("loopwarden", values, records)}
        only = [k for k in sides["after"] if not args.only or k in args.only.split(",")]
        cpu: dict = {(side, k): [] for side in sides for k in only}
        gc.collect()
        gc.freeze()
        gctune.for_streaming()
        for r in range(args.rounds):
            for k in only:
                for side in (("before", "after") if r % 2 == 0 else ("after", "before")):
                    gc.collect()
                    t0 = time.process_time()
                    sides[side][k]()
                    cpu[side, k].append(time.process_time() - t0)
    n = len(values)
    med = {key: statistics.median(v) / n * 1e6 for key, v in cpu.items()}
    print(f"{n:,} events, {args.rounds} rounds, CPU µs per event (median); before = {args.revision}")
    for k in only:
        print(f"{k:20s} before {med['before', k]:7.3f}  after {med['after', k]:7.3f}  after/before {med['after', k] / med['before', k]:.3f}")
    if "decode" in only and "replay" in only:
        for side in sides:
            print(f"{side}: replay : decode-only {med[side, 'decode'] / med[side, 'replay']:.3f}")


if __name__ == "__main__":
    main()
