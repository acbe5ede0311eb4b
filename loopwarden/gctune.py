"""Garbage-collector settings of the shells that fold streams (the worker and offline replay).

Folding allocates many short-lived objects per event (decoded events, results,
transitions) while the runs' states live long. With CPython's default thresholds
(700, 10, 10) the young generation is collected every few hundred events and the
full collections walk every state held; measured on the bench fleet (``bench/core.py``)
that is 10-30 % of replay's time. Raising the thresholds keeps the same collector
(cycles are still found) and makes its passes rare. Both shells call
:func:`for_streaming` once at start; the pure core does not touch the collector.
"""

from __future__ import annotations

import gc

THRESHOLDS = (50_000, 20, 100)


def for_streaming() -> tuple[int, int, int]:
    """Set :data:`THRESHOLDS`; returns the thresholds in force before, to restore them."""
    before = gc.get_threshold()
    gc.set_threshold(*THRESHOLDS)
    return before  # type: ignore[return-value]
