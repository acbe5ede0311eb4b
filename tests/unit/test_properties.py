"""Hypothesis properties of the codecs, the core and replay."""

from __future__ import annotations

from collections import defaultdict

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loopwarden.codecs import JSON, MSGPACK, InvalidEvent, decode_input, encode
from loopwarden.replay import Replay, iter_lines, replay_lines
from loopwarden.rules import RunState, apply
from tests import strategies as S

EVENT_TYPES = {
    "run_started": S.run_started,
    "step_finished": S.step_finished,
    "run_ended": S.run_ended(),
    "approval_routed": S.approval_routed,
    "approval_resolved": S.approval_resolved,
    "outcome_receipt": S.outcome_receipt,
}


def _round_trip(strategy, content_type):
    @given(strategy)
    def check(event):
        assert decode_input(encode(event, content_type), content_type) == event

    check()


def test_round_trip_every_type_json() -> None:
    """decode(encode(x)) == x in JSON, for every input event type."""
    for strategy in EVENT_TYPES.values():
        _round_trip(strategy, JSON)


def test_round_trip_every_type_msgpack() -> None:
    """decode(encode(x)) == x in MessagePack, for every input event type."""
    for strategy in EVENT_TYPES.values():
        _round_trip(strategy, MSGPACK)


def _replay_bytes(data: bytes, chunk_sizes: list[int] | None = None, advance_s: float = 3600) -> list[bytes]:
    if chunk_sizes:
        chunks, pos, i = [], 0, 0
        while pos < len(data):
            size = chunk_sizes[i % len(chunk_sizes)]
            chunks.append(data[pos : pos + size])
            pos, i = pos + size, i + 1
    else:
        chunks = [data]
    replay = Replay()
    out: list[bytes] = []
    lines = (("mem", n, line) for n, line in enumerate(iter_lines(chunks), 1))
    replay_lines(lines, replay, lambda t: out.append(encode(t)), lambda b: None)
    out += [encode(t) for t in replay.finish(advance_s)]
    return out


def _to_bytes(events) -> bytes:
    return b"".join(encode(e) + b"\n" for e in events)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(S.fleet(), st.lists(st.integers(1, 97), min_size=1, max_size=5))
def test_replay_is_deterministic_and_chunking_independent(events, chunk_sizes) -> None:
    """Replaying the same bytes twice, in any chunking, yields the same transitions."""
    data = _to_bytes(events)
    whole = _replay_bytes(data)
    assert _replay_bytes(data) == whole
    assert _replay_bytes(data, chunk_sizes) == whole


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(S.fleet(), st.floats(0, 10 * 86400))
def test_transition_invariants(events, advance_s) -> None:
    """to_state != from_state; seq is 1, 2, 3... per run; each transition continues the last."""
    replay = Replay()
    out = []
    for e in events:
        out += replay.feed(e)
    out += replay.finish(advance_s)
    by_run = defaultdict(list)
    for t in out:
        assert t.to_state != t.from_state
        by_run[t.run_id].append(t)
    for run_id, ts in by_run.items():
        assert [t.seq for t in ts] == list(range(1, len(ts) + 1)), run_id
        assert ts[0].from_state is None and ts[0].reason == "started"
        for prev, cur in zip(ts, ts[1:]):
            assert cur.from_state == prev.to_state
    # every run that had an event on agent.steps is in exactly one final state
    stepped = {e.run_id for e in events if e.__struct_config__.tag != "outcome_receipt"}
    assert set(by_run) == stepped
    for run_id in stepped:
        state = replay.states.get(run_id)
        if state is not None and state.tomb:  # dropped after retention: its last seq is remembered
            assert state.health is None and state.seq == by_run[run_id][-1].seq
        elif state is not None:
            assert state.health == by_run[run_id][-1].to_state


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300) | st.text(max_size=200).map(str.encode))
def test_garbage_never_raises_anything_but_invalid_event(data) -> None:
    """Arbitrary bytes decode or raise InvalidEvent, never anything else."""
    for ctype in (JSON, MSGPACK):
        try:
            decode_input(data, ctype)
        except InvalidEvent as exc:
            assert exc.reason in InvalidEvent.REASONS
            assert str(exc)


@settings(max_examples=200, deadline=None)
@given(st.lists(S.any_event, max_size=30))
def test_core_accepts_any_valid_event_sequence(events) -> None:
    """Any sequence of valid events (even nonsensical ones) folds without an exception."""
    states: dict[str, RunState] = {}
    for e in events:
        res = apply(states.get(e.run_id), e, e.ts)
        assert res.state is not None
        states[e.run_id] = res.state
