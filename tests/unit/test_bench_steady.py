"""The ingest bench's steady-state window: 10 % and 90 % crossings of a sampled progress series."""

from __future__ import annotations

import json

from bench.ingest import Result, _marks, crossing


def test_crossing_interpolates_between_samples():
    """A target between two samples is placed linearly in time and CPU."""
    samples = [(0, 10.0, 1.0), (100, 11.0, 2.0), (300, 12.0, 4.0)]
    assert crossing(samples, 200) == (200, 11.5, 3.0)


def test_crossing_on_a_sample_and_out_of_reach():
    """A target met exactly returns that sample; one never reached gives None."""
    samples = [(0, 1.0, 0.0), (50, 2.0, 0.5), (50, 3.0, 0.6)]
    assert crossing(samples, 50) == (50, 2.0, 0.5)
    assert crossing(samples, 51) is None


def test_steady_rate_from_two_marks():
    """The steady rate and CPU per event come from the marks, not from ready -> done."""
    res = Result("worker", events=1000, wall_s=10.0, cpu_s=5.0)
    res.set_steady([(100, 2.0, 1.0), (900, 4.0, 1.8)])
    assert res.steady_eps == 400.0
    assert abs(res.steady_cpu_us - 1000.0) < 1e-9
    assert res.eps == 100.0


def test_no_marks_leave_the_steady_figures_unknown():
    """Fewer than two marks: the steady figures are nan, never a made-up rate."""
    res = Result("quix", events=10, wall_s=1.0, cpu_s=1.0)
    res.set_steady([(1, 0.0, 0.0)])
    assert res.steady_eps != res.steady_eps


def test_peer_marks_file(tmp_path):
    """The peers' progress file (one JSON line per mark) reads back as (n, t, cpu)."""
    path = tmp_path / "progress.jsonl"
    path.write_text("".join(json.dumps({"n": n, "t": t, "cpu": c}) + "\n" for n, t, c in [(10, 1.5, 0.2), (90, 3.5, 1.0)]))
    assert _marks(path) == [(10, 1.5, 0.2), (90, 3.5, 1.0)]
    assert _marks(tmp_path / "missing.jsonl") == []


def test_peer_progress_marks_ready_then_ten_and_ninety_percent(tmp_path, monkeypatch):
    """A Python peer writes its ready file at the first message and one mark at 10 % and at 90 %."""
    from bench.peers import Progress

    monkeypatch.setenv("PEER_TOTAL", "200")
    monkeypatch.setenv("PEER_PROGRESS_FILE", str(tmp_path / "progress.jsonl"))
    monkeypatch.setenv("PEER_READY_FILE", str(tmp_path / "ready.json"))
    progress = Progress()
    for _ in range(200):
        progress.tick()
    assert json.loads((tmp_path / "ready.json").read_text()).keys() == {"t", "cpu"}
    assert [n for n, _t, _c in _marks(tmp_path / "progress.jsonl")] == [20, 180]


def _record(key: bytes, value: bytes):
    from aiokafka.structs import ConsumerRecord

    return ConsumerRecord("c", 0, 0, 0, 0, key, value, None, len(key), len(value), [])


def test_committed_progress_sums_each_partitions_last_offsets_record():
    """The worker's committed progress: per changelog partition its last offsets record, summed, capped at the ends."""
    from aiokafka import TopicPartition

    from bench.ingest import CommittedProgress
    from loopwarden.engine.recovery import encode_offsets
    from loopwarden.engine.store import OFFSETS_KEY

    ends = {TopicPartition(t, p): 100 for t in ("steps", "outcomes") for p in range(2)}
    progress = CommittedProgress(ends)
    assert not progress.take({TopicPartition("c", 0): [_record(b"run-1", b"state")]})
    assert progress.take({TopicPartition("c", 0): [
        _record(OFFSETS_KEY, encode_offsets({"steps": 10, "outcomes": 5})),
        _record(b"run-1", b"state"),
        _record(OFFSETS_KEY, encode_offsets({"steps": 30, "outcomes": 5, "ticks": 7})),  # ticks: not the backlog's
    ]})
    assert progress.total == 35
    progress.take({TopicPartition("c", 1): [_record(OFFSETS_KEY, encode_offsets({"steps": 250}))]})
    assert progress.total == 135  # capped at the end offset (100)
    progress.take({TopicPartition("c", 0): [_record(OFFSETS_KEY, encode_offsets({"steps": 40, "outcomes": 20}))]})
    assert progress.total == 160
    assert progress.by_partition == {0: 60, 1: 100}


def test_committed_progress_reads_the_format_with_the_projects_decoder():
    """A record that is not an offsets map counts as nothing (recovery's decoder), not as a crash."""
    from aiokafka import TopicPartition

    from bench.ingest import CommittedProgress

    progress = CommittedProgress({TopicPartition("steps", 0): 100})
    progress.add(0, b"\xc1not msgpack")
    assert progress.total == 0


def test_steps_in_window_counts_moves_between_the_marks():
    """Only moves landing inside 10-90 % count: how finely a reading resolves the steady window."""
    from bench.ingest import steps_in_window

    samples = [(0, 0, 0), (5, 1, 0), (20, 2, 0), (20, 3, 0), (50, 4, 0), (90, 5, 0), (100, 6, 0)]
    assert steps_in_window(samples, 100) == 3  # 20, 50, 90


def test_allowed_us_is_the_cpu_per_event_one_core_needs_for_the_target_rate() -> None:
    from bench.ingest import allowed_us

    # 2.5x a peer at 25,500 ev/s is 63,750 ev/s: one core gives it at 15.7 µs an event
    assert abs(allowed_us(2.5, 25_500) - 1e6 / 63_750) < 1e-9
    assert round(allowed_us(1.5, 55_800), 2) == 11.95
    assert allowed_us(0.25, 316_000) > allowed_us(0.5, 316_000)  # a lower line allows more
    assert allowed_us(2.5, 0) != allowed_us(2.5, 0)  # no peer rate: nan, not a division error


def test_cut_note_says_the_share_to_cut_or_that_a_reading_is_missing() -> None:
    from bench.ingest import cut_note

    assert cut_note(15.7, 17.1) == "8% to cut"
    assert cut_note(16.0, 12.0) == "within it"
    assert cut_note(float("nan"), 17.1) == cut_note(15.7, float("nan")) == "a reading is missing"
