"""Bench c's look inside its worker: on SIGUSR1, the Python allocator's own figures, written to a file.

Loaded by the bench's worker only (``bench.kafka`` puts this directory first on its PYTHONPATH and sets
``LOOPWARDEN_BENCH_PROBE`` to a directory). On SIGUSR1 the worker collects garbage, reads pymalloc's
statistics (``sys._debugmallocstats``: counters kept anyway, no tracing, nothing slowed between reads) and
writes ``<n>.json`` there: bytes in allocated blocks (the live Python objects of at most 512 B: what a run
holds is made of these), bytes in free blocks, arenas (1 MiB each, given back only when empty), and per
block size (``classes``) its pools (16 KiB, one size each), blocks in use and blocks free.
"""

import os

if os.environ.get("LOOPWARDEN_BENCH_PROBE"):
    import gc
    import json
    import signal
    import sys
    import tempfile

    def _malloc_stats() -> dict:
        with tempfile.TemporaryFile() as f:
            sys.stderr.flush()
            saved = os.dup(2)
            os.dup2(f.fileno(), 2)  # it prints to the C stderr
            try:
                sys._debugmallocstats()
            finally:
                os.dup2(saved, 2)
                os.close(saved)
            f.seek(0)
            text = f.read().decode()
        out = {}
        classes = {}  # block size -> [pools, blocks in use, blocks free] (the table before the "# " lines)
        for line in text.splitlines():
            cols = line.split()
            if len(cols) == 5 and all(c.isdigit() for c in cols):
                classes[cols[1]] = [int(c) for c in cols[2:]]
            elif line.startswith("# ") and "=" in line:
                name, value = line[2:].rsplit("=", 1)
                try:
                    out[name.strip()] = int(value.strip().replace(",", ""))
                except ValueError:
                    pass
        out["classes"] = classes
        out.update(_mallinfo())
        return out

    def _mallinfo() -> dict:
        """glibc's heap (mallinfo2): bytes in use by malloc'd blocks (dict and set tables, objects over 512 B) and
        free bytes it keeps; {} elsewhere."""
        import ctypes
        import ctypes.util

        class Info(ctypes.Structure):
            _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                             "fsmblks", "uordblks", "fordblks", "keepcost")]

        try:
            fn = ctypes.CDLL(ctypes.util.find_library("c")).mallinfo2
        except (OSError, AttributeError, TypeError):
            return {}
        fn.restype = Info
        info = fn()
        return {"malloc in use": info.uordblks + info.hblkhd, "malloc free": info.fordblks}

    def _dump(signum, frame) -> None:
        where = os.environ["LOOPWARDEN_BENCH_PROBE"]
        n = len([f for f in os.listdir(where) if f.endswith(".json")])
        gc.collect()
        with open(os.path.join(where, f"{n}.tmp"), "w") as f:
            json.dump(_malloc_stats(), f)
        os.rename(os.path.join(where, f"{n}.tmp"), os.path.join(where, f"{n}.json"))

    signal.signal(signal.SIGUSR1, _dump)
