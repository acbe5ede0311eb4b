"""The state codec's formats side by side: ``python -m bench.codec [runs] [rounds]``.

Bytes per state and CPU per state (``time.process_time``) of format 2 (written now: no run id, times
relative to ``last_seen_ts``, ids holding the run id as [before, after]) against format 1 (what
main wrote before, still read), on the bench's fleet (``valid_messages(runs, seed=23)``, as
``bench.memory`` folds it), in one process, the rounds in shuffled order; medians. Format 1's encoder
is the codec's fallback (``_encode_v1``) and its decoder is ``decode_state`` on version-1 bytes: the
code main ran before format 2, unchanged.
"""

from __future__ import annotations

import gc
import random
import statistics
import sys
import time


def main(runs: int = 5000, rounds: int = 16) -> None:
    from bench.core import Replay, decode_input, valid_messages
    from loopwarden.rules import codec

    r = Replay()
    for m in valid_messages(runs, seed=23):
        r.feed(decode_input(m.value))
    states = list(r.states.values())
    rids = [s.run_id for s in states]
    v1 = [codec._encode_v1(s) for s in states]
    v2 = [codec.encode_state(s) for s in states]
    assert all(codec.decode_state(b, k) == s for b, k, s in zip(v2, rids, states))
    assert all(codec.decode_state(b) == s for b, s in zip(v1, states))
    for name, blobs in (("format 1", v1), ("format 2", v2)):
        sizes = sorted(map(len, blobs))
        print(f"{name}: bytes median {statistics.median(sizes):.0f}, mean {sum(sizes) / len(sizes):.1f}, "
              f"p99 {sizes[int(len(sizes) * 0.99) - 1]}, max {sizes[-1]} ({len(sizes):,} states)")
    jobs = {
        "encode 1": lambda: [codec._encode_v1(s) for s in states],
        "encode 2": lambda: [codec.encode_state(s) for s in states],
        "decode 1": lambda: [codec.decode_state(b) for b in v1],
        "decode 2": lambda: [codec.decode_state(b, k) for b, k in zip(v2, rids)],
        "listing 1": lambda: [codec.decode_listing(b) for b in v1],
        "listing 2": lambda: [codec.decode_listing(b, k) for b, k in zip(v2, rids)],
    }
    took: dict[str, list[float]] = {k: [] for k in jobs}
    order = list(jobs)
    rnd = random.Random(1)
    gc.disable()
    for _ in range(rounds):
        rnd.shuffle(order)
        for k in order:
            t0 = time.process_time()
            jobs[k]()
            took[k].append((time.process_time() - t0) / len(states) * 1e6)
    gc.enable()
    for k, v in took.items():
        print(f"{k:10s} {statistics.median(v):5.2f} µs per state (min {min(v):.2f}, {rounds} rounds)")
    for what in ("encode", "decode", "listing"):
        print(f"{what}: format 2 / format 1 = "
              f"{statistics.median(took[what + ' 2']) / statistics.median(took[what + ' 1']):.3f}")


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:3]))
