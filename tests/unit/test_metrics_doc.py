"""The README's metrics table names every metric the worker exports, and nothing it does not."""

from __future__ import annotations

import re
from pathlib import Path

from loopwarden.streams.metrics import Metrics


def test_the_readme_lists_every_loopwarden_metric() -> None:
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    section = readme.split("### Metrics", 1)[1].split("\n### ", 1)[0]
    documented = set(re.findall(r"^\| `(loopwarden_[a-z_]+)` \|", section, flags=re.M))
    exported = {family.name for family in Metrics().registry.collect() if family.name.startswith("loopwarden_")}
    # prometheus-client drops a counter's _total suffix from the family name
    exported = {n + "_total" if f"`{n}_total`" in section else n for n in exported}
    assert documented == exported, (exported - documented, documented - exported)
    assert "process_resident_memory_bytes" in {s.name for f in Metrics().registry.collect() for s in f.samples}
