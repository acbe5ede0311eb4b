"""The worker's heap trim gives pages freed in the middle of the C heap back to the OS."""

from __future__ import annotations

import os
import sys

import pytest

from bench.common import rss_kb
from loopwarden.engine import memory


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RSS from /proc and glibc: Linux only")
def test_trim_returns_freed_pages_that_free_alone_keeps() -> None:
    """Free most of ~60 MB of C-heap blocks while every 50th stays alive: RSS stays up after free()
    (the survivors pin the heap), and falls once trim() has run."""
    assert memory.available(), "glibc without malloc_trim?"
    keep, drop = [], []
    for i in range(60_000):
        block = bytearray(1000 + (i % 7) * 100)  # > 512 B: malloc, not Python's small-object arenas
        block[::4096] = b"x" * len(block[::4096])  # touch every page
        (keep if i % 50 == 0 else drop).append(block)
    del drop
    before = rss_kb(os.getpid())["VmRSS"]
    took = memory.trim()
    after = rss_kb(os.getpid())["VmRSS"]
    assert took is not None and took < 5.0
    assert before - after > 30_000, f"RSS {before} KiB before the trim, {after} KiB after"
    assert len(keep) == 1200
