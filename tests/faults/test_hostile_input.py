"""Hostile input at volume: 100,000 messages of byte-level mutations of valid events mixed with a
clean fleet. The worker never crashes or stalls, its lag returns to 0, every bad message is in the
dead-letter topic once with its reason, every clean run ends as replay says, and its RSS stays bounded.

What counts as bad is what the decoders refuse (by topic and content-type header), a key that is
not the run id, or a ts more than the skew bound ahead of the wall clock: the same rules, computed
here from the messages as sent, so the dead-letter topic must hold exactly that many, by reason.
"""

from __future__ import annotations

import json
import os
import random
import time
from collections import Counter
from pathlib import Path

import msgspec
import pytest

from bench.common import rss_kb
from loopwarden.codecs import MSGPACK, InvalidEvent, decode_outcome_event, decode_step_event
from loopwarden.simulate import fleet
from loopwarden.engine.assignment import partition_of
from tests.faults.oracle import check, figures, reasons, wait_runs
from tests.integration.harness import make_worker, publish, read_all, run, tick, unique_config
from tests.integration.test_processor import ADVANCE_MS, replay_final

VOLUME = int(os.environ.get("LOOPWARDEN_FUZZ_MESSAGES", "100000"))
# 100,000 messages take ~2 min here; a million (make soak) ~10x that
pytestmark = pytest.mark.timeout(600 + VOLUME // 400)
SKEW_MS = 300_000
# With the event clock, a partition's clock is the latest ts it saw: valid fuzz events (or bit flips
# that stay valid) on a clean run's partition would move its clock and its runs' timers. So clean
# runs live on partitions 0-3 and fuzz runs on 4-7; only messages without a key (spread by the
# producer) and dead letters reach both.
PARTITIONS = 8
CLEAN = range(0, 4)
FUZZ = range(4, 8)


def _json_mutations(doc: dict, rng: random.Random) -> tuple[dict | bytes, list | None, str]:
    """One structural mutation of an event document: (new value, headers, what)."""
    d = dict(doc)
    kind = rng.randrange(9)
    if kind == 0:
        field = rng.choice([k for k in d if k != "type"])
        d[field] = rng.choice(["x", -1, 1.5, [], {}, None, True, 2**70])
        return d, None, "wrong_type"
    if kind == 1:
        d.pop(rng.choice([k for k in d if k != "type"]), None)
        return d, None, "missing_field"
    if kind == 2:
        d["type"] = rng.choice(["nope", "", "STEP_FINISHED", 7])
        return d, None, "unknown_type"
    if kind == 3:
        d[rng.choice(["run_id", "agent", "x_unknown"])] = "A" * (300_000 if rng.random() < 0.005 else rng.choice([201, 5_000]))
        return d, None, "huge_string"
    if kind == 4:
        depth = 60_000 if rng.random() < 0.01 else rng.choice([50, 2_000])
        raw = json.dumps(d)[:-1] + ', "x_nested": ' + "[" * depth + "]" * depth + "}"
        return raw.encode(), None, "deep_nesting"
    if kind == 5:
        d["ts"] = rng.choice([2**53 - 1, int(time.time() * 1000) + 3_600_000])
        return d, None, "future_ts"
    if kind == 6:
        return msgspec.msgpack.encode(d), rng.choice([None, [("content-type", b"application/json")]]), "msgpack_as_json"
    if kind == 7:
        return json.dumps(d).encode(), rng.choice([[("content-type", MSGPACK.encode())],
                                                   [("content-type", b"text/plain")]]), "wrong_content_type"
    return d, [("x-junk", os.urandom(60_000 if rng.random() < 0.02 else 10))], "big_header"


def hostile(n: int, seed: int) -> list[tuple[str, bytes | None, bytes | None, list | None, str]]:
    """(role, key, value, headers, kind): mutations of a fuzz fleet's events (run ids fuzz-*) and some verbatim."""
    rng = random.Random(seed)
    base = [m for m in fleet(max(50, n // 40), seed=seed, start_ms=int(time.time() * 1000) - 7_200_000, bad_every=0)]
    docs = [(m.topic, json.loads(m.value)) for m in base]
    renamed: dict[str, str] = {}
    for _, d in docs:
        if d["run_id"] not in renamed:
            k = 0
            while partition_of(f"fuzz-{k}-{d['run_id']}".encode(), PARTITIONS) not in FUZZ:
                k += 1
            renamed[d["run_id"]] = f"fuzz-{k}-{d['run_id']}"
        d["run_id"] = renamed[d["run_id"]]
    out = []
    while len(out) < n:
        role, doc = docs[rng.randrange(len(docs))]
        key = doc["run_id"].encode()
        roll = rng.random()
        if roll < 0.25:
            out.append((role, key, json.dumps(doc).encode(), None, "verbatim"))
            continue
        if roll < 0.35:  # byte level
            raw = bytearray(json.dumps(doc).encode())
            what = rng.randrange(4)
            if what == 0:
                raw = raw[: rng.randrange(len(raw))]
                kind = "truncated"
            elif what == 1:
                i = rng.randrange(len(raw))
                raw[i:i] = rng.choice([b"\xff\xfe", b"\xc3", b"\xed\xa0\x80"])
                kind = "invalid_utf8"
            elif what == 2:
                for _ in range(rng.randint(1, 5)):
                    raw[rng.randrange(len(raw))] = rng.randrange(256)
                kind = "bit_flips"
            else:
                raw = bytearray(os.urandom(rng.choice([0, 1, 17, 4096])))
                kind = "random_bytes"
            out.append((role, key, bytes(raw), None, kind))
            continue
        if roll < 0.40:
            out.append((role, rng.choice([None, b"other-run", b""]), json.dumps(doc).encode(), None, "wrong_key"))
            continue
        if roll < 0.4002:
            out.append((role, key, os.urandom(950_000), None, "near_size_limit"))
            continue
        if roll < 0.4007:
            out.append((role, key, None, None, "null_value"))
            continue
        value, headers, kind = _json_mutations(doc, rng)
        out.append((role, key, value if isinstance(value, bytes) else json.dumps(value).encode(), headers, kind))
    return out


def predicted_reason(role: str, key: bytes | None, value: bytes | None, headers, now_ms: int) -> str | None:
    """The dead-letter reason the worker must give, or None for a valid message (its rules, from outside)."""
    ctype = next((v.decode("utf-8", "replace") for k, v in headers or () if k.lower() == "content-type"), None)
    try:
        decode = decode_step_event if role == "steps" else decode_outcome_event
        event = decode(value if value is not None else b"", ctype)
    except InvalidEvent as exc:
        return exc.reason
    if key is None or key != event.run_id.encode():
        return "key_mismatch"
    if event.ts > now_ms + SKEW_MS:
        return "ts_in_future"
    return None


def consumer_lag(worker) -> float | None:
    """The worker's summed loopwarden_consumer_lag (None before it reports any)."""
    status, body = worker.get("/metrics")
    lag = [float(line.split()[-1]) for line in body.decode().splitlines() if line.startswith("loopwarden_consumer_lag{")]
    return sum(lag) if status == 200 and lag else None


def test_hostile_input_at_volume_is_dead_lettered_once_and_stops_nothing(kafka, tmp_path: Path) -> None:
    config = unique_config(kafka.bootstrap, partitions=PARTITIONS)
    worker = make_worker(config, tmp_path, clock="event", max_future_skew_s=SKEW_MS / 1000).start()
    try:
        assert worker.proc is not None
        rss_start = rss_kb(worker.proc.pid).get("VmRSS", 0)
        clean = [m for m in fleet(800, seed=31, bad_every=0) if partition_of(m.key, PARTITIONS) in CLEAN]
        expected, last = replay_final(clean)
        bad = hostile(VOLUME, seed=5)
        rng = random.Random(1)
        # hostile messages interleaved at random places, the clean fleet in order (no list.insert: O(n^2))
        slots: list[list] = [[] for _ in range(len(clean) + 1)]
        for role, key, value, headers, _ in bad:
            slots[rng.randrange(len(slots))].append((role, key, value, headers))
        mixed = list(slots[0])
        for m, after in zip(clean, slots[1:]):
            mixed.append((m.topic, m.key, m.value, None))
            mixed += after
        sent_at = int(time.time() * 1000)
        t0 = time.monotonic()
        run(publish(worker.config, mixed))
        published_s = time.monotonic() - t0
        want = Counter(r for role, key, value, headers, _ in bad
                       if (r := predicted_reason(role, key, value, headers, sent_at)) is not None)
        kinds = Counter(kind for *_, kind in bad)
        run(tick(worker.config, last + ADVANCE_MS))
        ts = wait_runs(worker.config, expected, timeout_s=300)
        # Dead letters commit with the offsets of what they came from: once the lag is 0, all are there.
        deadline = time.monotonic() + 180 + VOLUME // 1000
        zeros = 0
        while zeros < 2:  # twice in a row, a second apart: the high watermark it knows is fresh
            lag = consumer_lag(worker)
            zeros = zeros + 1 if lag == 0 else 0
            assert time.monotonic() < deadline, f"lag still {lag}"
            assert worker.proc.poll() is None, f"worker died:\n{worker.log_tail()}"
            time.sleep(1)
        time.sleep(2)  # anything beyond would show up now
        dead = run(read_all(worker.config, worker.config.deadletter_topic, timeout_s=120 + VOLUME // 1000))
        assert worker.proc.poll() is None, f"worker died:\n{worker.log_tail()}"
        sources = Counter((dict(r.headers)["source_topic"], dict(r.headers)["source_partition"],
                           dict(r.headers)["source_offset"]) for r in dead)
        assert max(sources.values()) == 1, "a message was dead-lettered twice"
        got = reasons(dead)
        assert got == want, {k: (got[k], want[k]) for k in set(got) | set(want) if got[k] != want[k]}
        assert consumer_lag(worker) == 0
        rss_end = rss_kb(worker.proc.pid).get("VmRSS", 0)
        assert rss_end < 600 * 1024, f"RSS {rss_end} KiB"
        fig = figures("hostile input", f"{len(bad):,} hostile messages ({len(kinds)} kinds)", ts, expected,
                      deadletters=len(dead), bad_sent=sum(want.values()), messages=len(mixed),
                      published_s=round(published_s, 1), rss_kib=[rss_start, rss_end],
                      reasons=dict(got), kinds=dict(kinds))
        check(fig)
    finally:
        worker.stop()

