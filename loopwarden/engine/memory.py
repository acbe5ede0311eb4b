"""Handing freed heap pages back to the operating system (glibc's ``malloc_trim``).

Measured in the soak (``tests/faults/soak.py``): with the runs held level, the Python
objects a worker holds stay level too (``sys.getallocatedblocks()`` and glibc's bytes in
use were flat for minutes), yet RSS stepped up at each burst. glibc returns freed memory
to the OS only from the top of its heap; what a burst frees in the middle stays resident
until ``malloc_trim(0)`` releases its whole free pages. The worker calls it every
``malloc_trim_s`` seconds (a few ms on a heap of tens of MB).

Elsewhere (musl, macOS) there is no ``malloc_trim``: :func:`trim` does nothing and says so.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import time


def _find_trim():
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        libc = ctypes.CDLL(name)
    except OSError:
        return None
    fn = getattr(libc, "malloc_trim", None)
    if fn is None:
        return None
    fn.argtypes = [ctypes.c_size_t]
    fn.restype = ctypes.c_int
    return fn


_malloc_trim = _find_trim()


def available() -> bool:
    """Whether this process's C library has ``malloc_trim`` (glibc)."""
    return _malloc_trim is not None


def trim() -> float | None:
    """Release the C heap's free pages to the OS; the seconds it took, None where unavailable."""
    if _malloc_trim is None:
        return None
    t0 = time.perf_counter()
    _malloc_trim(0)
    return time.perf_counter() - t0
