"""Small helpers shared by the benches: repeats, medians, formatting, machine note."""

from __future__ import annotations

import gc
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def repeat(fn: Callable[[], float], times: int) -> list[float]:
    """Call ``fn`` (which returns a measured duration or rate) ``times`` times, collecting between calls."""
    out = []
    for _ in range(times):
        gc.collect()
        out.append(fn())
    return out


def timed(fn: Callable[[], object]) -> float:
    """Seconds one call of ``fn`` takes."""
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def si(value: float, unit: str = "") -> str:
    """12345.6 -> '12.3 k'; keeps three significant figures."""
    if value != value:  # nan
        return "n/a"
    for div, prefix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= div:
            return f"{value / div:.3g} {prefix}{unit}".rstrip()
    return f"{value:.3g} {unit}".rstrip()


def duration(seconds: float) -> str:
    if seconds != seconds:
        return "n/a"
    if seconds < 1e-3:
        return f"{seconds * 1e6:.3g} µs"
    if seconds < 1:
        return f"{seconds * 1e3:.3g} ms"
    return f"{seconds:.3g} s"


def nbytes(n: float) -> str:
    if n != n:
        return "n/a"
    for div, unit in ((1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
        if abs(n) >= div:
            return f"{n / div:.3g} {unit}"
    return f"{n:.0f} B"


@dataclass
class Row:
    """One reported figure."""

    bench: str
    figure: str
    value: str
    note: str = ""


@dataclass
class Report:
    title: str
    rows: list[Row] = field(default_factory=list)

    def add(self, bench: str, figure: str, value: str, note: str = "") -> None:
        self.rows.append(Row(bench, figure, value, note))
        progress(f"  {bench:<10} {figure:<44} {value:>14}  {note}")


def progress(text: str) -> None:
    """Progress goes to stderr so stdout holds only the results."""
    print(text, file=sys.stderr, flush=True)


def machine_note() -> str:
    cpu = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    mem = ""
    try:
        with open("/proc/meminfo") as f:
            kb = int(f.readline().split()[1])
            mem = f", {kb / (1 << 20):.0f} GiB RAM"
    except (OSError, ValueError, IndexError):
        pass
    return (f"{os.cpu_count()} cores ({cpu}){mem}, {platform.system()} {platform.release()}, "
            f"Python {platform.python_version()}")


def _ticks(stat: str) -> int:
    """utime + stime, in clock ticks, of a /proc ``stat`` file (a process's or one of its threads')."""
    with open(stat) as f:
        fields = f.read().rpartition(")")[2].split()
    return int(fields[11]) + int(fields[12])


def cpu_s(pid: int) -> float:
    """CPU seconds (user + system) a process has used so far, from /proc; nan if gone."""
    try:
        return _ticks(f"/proc/{pid}/stat") / os.sysconf("SC_CLK_TCK")
    except OSError:
        return float("nan")


def jit_cpu_s(pid: int) -> float:
    """CPU seconds a JVM's JIT compiler threads have used so far (HotSpot names them "C1 CompilerThreadN" and
    "C2 CompilerThreadN"; Linux keeps 15 characters of a thread's name), from /proc; nan if not readable."""
    total = 0
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return float("nan")
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                if f.read().startswith(("C1 CompilerThre", "C2 CompilerThre")):
                    total += _ticks(f"/proc/{pid}/task/{tid}/stat")
        except OSError:  # the thread ended meanwhile (HotSpot stops idle compiler threads)
            continue
    return total / os.sysconf("SC_CLK_TCK")


def rss_kb(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM (peak) of a process, in kB, from /proc."""
    out = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                key, _, rest = line.partition(":")
                if key in ("VmRSS", "VmHWM"):
                    out[key] = int(rest.split()[0])
    except OSError:
        pass
    return out
