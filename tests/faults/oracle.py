"""Compare what a worker committed under faults with the oracle (offline replay of the same valid input).

Each fault test prints one ``FAULT-FIGURES {json}`` line: the faults injected, runs, runs missing or
in a wrong final state, (run_id, seq) repeated with the same or with different content, and dead
letters got vs expected. The reliability table of docs/testing.md is made of these lines.
"""

from __future__ import annotations

import json
from collections import Counter

from tests.integration.harness import final_states, read_topic, run, transitions


def wait_runs(config, expected: dict[str, str], timeout_s: float = 180) -> list[dict]:
    """agent.health (read_committed) once every run of ``expected`` is in its state (other runs may be there too)."""
    def done(records) -> bool:
        got = final_states(transitions(records))
        return all(got.get(r) == s for r, s in expected.items())

    return transitions(run(read_topic(config, config.health_topic, done, timeout_s)))


def figures(test: str, faults: str, ts: list[dict], expected: dict[str, str],
            deadletters: int = 0, bad_sent: int = 0, **extra) -> dict:
    """The figures of one fault test; asserts nothing (see :func:`check`)."""
    seen: dict[tuple[str, int], tuple] = {}
    duplicates = conflicting = 0
    examples: list = []
    for t in ts:
        key = (t["run_id"], t["seq"])
        content = (t["from_state"], t["to_state"], t["reason"], t["ts"])
        if key in seen:
            duplicates += 1
            conflicting += seen[key] != content
            if len(examples) < 3:
                examples.append({"run_seq": key, "first": seen[key], "again": content})
        else:
            seen[key] = content
    got = final_states(ts)
    holes = 0
    for run_id in expected:
        seqs = sorted(seq for r, seq in seen if r == run_id)
        holes += seqs != list(range(1, len(seqs) + 1))
    out = {
        "test": test, "faults": faults, "runs": len(expected), "transitions": len(ts),
        "missing": sum(1 for r in expected if r not in got),
        "wrong": sum(1 for r, s in expected.items() if r in got and got[r] != s),
        "seq_holes": holes, "duplicates": duplicates, "conflicting_duplicates": conflicting,
        "dead_letters": deadletters, "bad_messages": bad_sent, **extra,
    }
    wrong = [(r, got.get(r), s) for r, s in expected.items() if got.get(r) != s][:3]
    if examples or wrong:
        out["examples"] = {"duplicates": examples, "wrong (run, got, expected)": wrong}
    print("\nFAULT-FIGURES " + json.dumps(out))
    return out


def check(fig: dict) -> None:
    """Nothing lost, nothing wrong, nothing repeated, every bad message dead-lettered once."""
    bad = {k: fig[k] for k in ("missing", "wrong", "seq_holes", "duplicates", "conflicting_duplicates") if fig[k]}
    assert not bad, f"{fig['test']}: {bad}"
    assert fig["dead_letters"] == fig["bad_messages"], fig


def reasons(records) -> Counter:
    """error_reason header of each dead letter."""
    out: Counter = Counter()
    for r in records:
        headers = dict(r.headers or ())
        out[headers.get("error_reason", b"?").decode()] += 1
    return out
