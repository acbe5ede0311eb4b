"""Per-run state stays compact: no step records are kept."""

from __future__ import annotations

import msgspec

from loopwarden.codecs import RunStarted, StepFinished, ToolCall, Usage
from loopwarden.codecs.events import Policy
from loopwarden.rules import apply


def _state_after(n_steps: int):
    state = apply(None, RunStarted(run_id="big", ts=0, agent="a", policy=Policy(version="v", stop_when=())), 0).state
    for i in range(n_steps):
        ev = StepFinished(run_id="big", ts=i, step=i, finish_reason="tool-calls",
                          tool_calls=(ToolCall(id=f"tc-{i}", name="lookup", status="result"),),
                          usage=Usage(total_tokens=100))
        state = apply(state, ev, i).state
    return state


def test_ten_thousand_steps_do_not_grow_the_state() -> None:
    """A run with 10,000 steps keeps the same state size as one with 10."""
    small = len(msgspec.msgpack.encode(_state_after(10)))
    big_state = _state_after(10_000)
    big = len(msgspec.msgpack.encode(big_state))
    assert big_state.open[0].steps_seen == 10_000
    assert big_state.open[0].tokens == 1_000_000
    assert big <= small + 32, (small, big)  # only a few integers got wider
    assert big < 1024


def test_the_stored_form_stays_small_and_exact_too() -> None:
    """The store's codec (format 2) keeps a 10,000-step run as small as a 10-step one, and exact."""
    from loopwarden.rules import decode_state, encode_state

    small, big_state = encode_state(_state_after(10)), _state_after(10_000)
    big = encode_state(big_state)
    assert big[0] == 2 and len(big) <= len(small) + 16 and len(big) < len(msgspec.msgpack.encode(big_state)) // 2
    assert decode_state(big, "big") == big_state
