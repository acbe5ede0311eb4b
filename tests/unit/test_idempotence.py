"""Repeats are safe at any size: a repeated step or receipt never changes a run nor counts as new.

A run's state is bounded (at most MAX_GAPS open step gaps per segment, MAX_RECEIPT_IDS receipt
ids), so past the bounds loopwarden cannot always tell a repeat from a new event; what it must
never do is count a repeat again. Below the bounds it tells them apart exactly.
"""

from __future__ import annotations

import json
import random

from hypothesis import given, settings
from hypothesis import strategies as st

from loopwarden.codecs import decode_input
from loopwarden.rules import apply, decode_state, encode_state
from loopwarden.rules.machine import MAX_GAPS, MAX_RECEIPT_IDS
from tests.builders import ended, receipt, started, step


def _ev(d: dict):
    return decode_input(json.dumps(d).encode())


def _run(events, state=None, now=10**9):
    notes = []
    for e in events:
        res = apply(state, e, now)
        state = res.state
        notes += res.notes
    return state, notes


def _facts(state) -> tuple:
    seg = state.open.get(0)
    return (state.health, state.seq, seg.steps_seen, seg.tokens, seg.max_step, sorted(state.verified_kinds),
            sorted(state.negative_kinds), len(state.receipt_ids)) if seg else (state.health, state.seq)


def test_every_gap_is_filled_exactly_up_to_the_bound() -> None:
    """500 gaps (every other step first), then the missing steps: all counted once, then all repeats ignored."""
    n = 1000
    evens = [_ev(step(i, ts=1 + i)) for i in range(0, n, 2)]
    odds = [_ev(step(i, ts=1 + i)) for i in range(1, n, 2)]
    state, _ = _run([_ev(started(ts=1))] + evens)
    assert len(state.open[0].gaps) == n // 2 - 1 < MAX_GAPS
    state, notes = _run(odds, state)
    assert state.open[0].steps_seen == n and state.open[0].gaps == []
    before = encode_state(state)
    state, notes = _run(evens + odds, state)
    assert notes.count(("ignored", "duplicate_step")) == n
    assert _facts(decode_state(before, state.run_id)) == _facts(state)


def test_past_the_gap_bound_repeats_are_never_counted_again() -> None:
    """2,000 gaps: the lowest are forgotten; late steps there are 'untracked', never counted; the rest exact."""
    n = 4000
    evens = [_ev(step(i, ts=1 + i)) for i in range(0, n, 2)]
    state, _ = _run([_ev(started(ts=1))] + evens)
    seg = state.open[0]
    assert len(seg.gaps) == MAX_GAPS and seg.forgot_hi > 0
    seen = seg.steps_seen
    shuffled = evens + [_ev(step(i, ts=1 + i)) for i in range(1, n, 2)]
    random.Random(3).shuffle(shuffled)
    state, notes = _run(shuffled, decode_state(encode_state(state), state.run_id))  # through the store's codec, too
    seg = state.open[0]
    tracked_late = sum(1 for i in range(1, n, 2) if i > seg.forgot_hi)
    assert seg.steps_seen == seen + tracked_late  # each late step above the forgotten ones counted once
    assert notes.count(("ignored", "untracked_step")) + notes.count(("ignored", "duplicate_step")) == len(shuffled) - tracked_late
    again_state, again = _run(shuffled, state)
    assert _facts(again_state) == _facts(state) and all(n[0] == "ignored" for n in again if n[0] != "receipt")


@settings(max_examples=40, deadline=None)
@given(count=st.integers(1, 700), kinds=st.lists(st.sampled_from(["file", "message", "record"]), min_size=1, max_size=3),
       seed=st.integers(0, 1000))
def test_a_repeated_receipt_never_counts_as_new_at_any_size(count: int, kinds: list[str], seed: int) -> None:
    """However many receipts a run gets, a repeat is a duplicate or untracked, never on_time/late/negative."""
    run = [_ev(started(ts=1, required_outcomes=["file"])), _ev(step(0, ts=2)), _ev(ended("natural_finish", 1, ts=3))]
    receipts = [_ev(receipt(f"rc-{i}", kind=kinds[i % len(kinds)], verified=i % 5 != 4, ts=4 + i)) for i in range(count)]
    state, first = _run(run + receipts)
    counted_first = [n for n in first if n[0] == "receipt"]
    assert sum(label in ("on_time", "late", "negative") for _, label in counted_first) == min(count, MAX_RECEIPT_IDS)
    facts = _facts(state)
    repeats = receipts[:]
    random.Random(seed).shuffle(repeats)
    state, notes = _run(repeats, state)
    labels = [label for kind, label in notes if kind == "receipt"]
    assert len(labels) == count and set(labels) <= {"duplicate", "untracked"}
    assert labels.count("duplicate") == min(count, MAX_RECEIPT_IDS)
    assert _facts(state) == facts and len(state.receipt_ids) <= MAX_RECEIPT_IDS
