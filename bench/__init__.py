"""Benchmarks: figures printed side by side, medians over repeats, never timed assertions.

Run ``python -m bench.run`` (``--quick`` for a short run); see bench/README.md.
"""
