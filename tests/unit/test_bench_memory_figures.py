"""Bench c's memory figures per run (bench.kafka.per_run_figures) and its probe's reading of pymalloc."""

import importlib.util
import os

from bench.kafka import PROBE, per_run_figures

MiB = 2**20


def _mark(arenas: int, allocated: int, pools: int) -> dict:
    return {"arenas allocated current": arenas, "bytes in allocated blocks": allocated,
            "classes": {"64": [pools, 0, 0]}, "malloc in use": arenas * 100_000}


def _round(**more) -> dict:
    res = {"rss_paced": 100 * MiB, "runs_paced": 1000, "rss_warm": 120 * MiB, "runs_warm": 21_000,
           "rss_ingest": 132 * MiB, "runs_ingest": 41_000, "cpu_ingest_s": 2.0, "messages": 100_000, "ingest_s": 5.0,
           "malloc": {"paced": _mark(20, 18 * MiB, 1200), "warm": _mark(36, 26 * MiB, 1900),
                      "ingest": _mark(44, 33 * MiB, 2340)}}
    res.update(more)
    return res


def test_marginals_are_read_between_the_two_backlogs_per_run_added():
    """RSS, live objects and arenas per run come from the warm and ingest marks, over the runs those added."""
    f = per_run_figures(_round())
    assert f["rss"] == 12 * MiB / 20_000
    assert f["alloc"] == 7 * MiB / 20_000
    assert f["arenas"] == 8 * MiB / 20_000
    assert f["malloc"] == 8 * 100_000 / 20_000  # glibc's bytes in use, same marks
    assert f["first_rss"] == 20 * MiB / 20_000 and f["first_arenas"] == 16 * MiB / 20_000
    assert f["cpu_us"] == 20.0 and f["ingest_eps"] == 20_000
    assert "slope" not in f  # two marks: no slope to fit


def test_held_sets_aside_the_arenas_empty_pools():
    """'held' is RSS with the arenas' empty pools replaced by the used pools (16 KiB each) they hold."""
    f = per_run_figures(_round())
    # RSS +12 MiB, arenas +8 MiB, used pools +440 (6.875 MiB): held +10.875 MiB
    assert f["held"] == (12 * MiB - 8 * MiB + 440 * 2**14) / 20_000


def test_slope_is_fitted_over_every_mark_after_the_first_backlog():
    """With further backlogs the slope is least squares over warm, ingest and each further mark."""
    f = per_run_figures(_round(rss_more0=144 * MiB, runs_more0=61_000, rss_more1=150 * MiB, runs_more1=81_000))
    xs, ys = [21_000, 41_000, 61_000, 81_000], [120 * MiB, 132 * MiB, 144 * MiB, 150 * MiB]
    mx, my = sum(xs) / 4, sum(ys) / 4
    want = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    assert abs(f["slope"] - want) < 1e-9
    assert 500 < f["slope"] < 600


def test_probe_reads_every_size_class_of_this_interpreter(tmp_path, monkeypatch):
    """The probe's table per block size sums to pymalloc's own count of bytes in allocated blocks."""
    monkeypatch.setenv("LOOPWARDEN_BENCH_PROBE", str(tmp_path))
    spec = importlib.util.spec_from_file_location("probe_sitecustomize", os.path.join(PROBE, "sitecustomize.py"))
    module = importlib.util.module_from_spec(spec)
    import signal

    saved = signal.getsignal(signal.SIGUSR1)
    try:
        spec.loader.exec_module(module)
        stats = module._malloc_stats()
    finally:
        signal.signal(signal.SIGUSR1, saved)
    classes = stats["classes"]
    assert "16" in classes and "512" in classes
    in_use = sum(int(size) * blocks for size, (_pools, blocks, _free) in classes.items())
    assert abs(in_use - stats["bytes in allocated blocks"]) < 0.05 * stats["bytes in allocated blocks"]
    assert sum(pools for pools, _u, _f in classes.values()) <= stats["arenas allocated current"] * 64
