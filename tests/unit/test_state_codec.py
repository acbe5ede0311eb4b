"""The compact state codec: an exact round trip, small bytes, clear errors on bad bytes."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loopwarden.codecs import Approval, Custom, LoopFinished, Policy, RunStarted, StepFinished, ToolCall, Usage
from loopwarden.codecs.events import StepCount, TokenBudget, ToolCallCondition
from loopwarden.replay import Replay
from loopwarden.rules import RunState, apply, decode_state, encode_state
from loopwarden.rules.codec import VERSION, WORDS, decode_listing
from loopwarden.simulate import fleet as sim_fleet
from tests import strategies as S


def _states_after(events, advance_s: float = 0.0) -> list[RunState]:
    replay = Replay()
    for ev in events:
        replay.feed(ev)
    replay.finish(advance_s)
    return list(replay.states.values())


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(S.fleet(), st.sampled_from([0, 350, 3600]))
def test_round_trip_of_folded_states(events, advance_s) -> None:
    """decode_state(encode_state(s)) == s for every state random event sequences fold into, and
    decode_listing (the read index's partial decode) reads the same listing as the whole state gives."""
    for state in _states_after(events, advance_s):
        data = encode_state(state)
        assert data[0] == VERSION
        back = decode_state(data)
        assert back == state
        assert msgspec.structs.asdict(back) == msgspec.structs.asdict(state)
        assert encode_state(back) == data  # a decoded state encodes to the same bytes
        assert decode_listing(data) == _listing(state)


def _listing(s: RunState) -> tuple | None:
    """What /runs lists of a state, from the decoded state: its last transition's ts, seq and reason."""
    if s.health is None or s.tomb:
        return None
    if s.history:
        seq, ts, _to, reason = s.history[-1]
        return ts, s.run_id, s.health, s.agent, seq, reason
    return s.last_seen_ts, s.run_id, s.health, s.agent, s.seq, ""


@settings(max_examples=200, deadline=None)
@given(S.run_started, st.lists(S.step_finished, max_size=5), S.approvals)
def test_round_trip_of_any_policy_and_approval(started, steps, approval) -> None:
    """Any valid policy (every condition kind, any durations) and approval survive the trip."""
    state = apply(None, started, started.ts).state
    for step in steps:
        state = apply(state, msgspec.structs.replace(step, run_id=started.run_id), started.ts).state
    state.approval = approval  # as a run_ended with approval_required would set it
    state.approval_pending = True
    assert decode_state(encode_state(state)) == state


def test_unknown_strings_and_every_word_survive() -> None:
    """Words of the table travel as numbers, any other string as itself."""
    state = RunState(run_id="r", health="SOMETHING_NEW", reported_cause="a_new_cause",
                     ignored={w: i for i, w in enumerate(WORDS)} | {"new_kind": 7},
                     history=[(i, i, w, w) for i, w in enumerate(WORDS)][-32:],
                     policy=Policy(version="v", stop_when=(StepCount(count=3), ToolCallCondition(tools=("a", "b")),
                                                           LoopFinished(), TokenBudget(max_tokens=9),
                                                           Custom(name="c", role="completion")),
                                   inactivity_timeout_s=300, receipt_window_s=0.5,
                                   required_outcomes=("file", "record")),
                     approval=Approval(approval_id="a", tool_call_id="t", tool_name="n"))
    assert decode_state(encode_state(state)) == state


def test_decoded_policies_are_shared() -> None:
    """Runs with equal policies hold one Policy object once decoded (memory follows policies, not runs)."""
    policy = Policy(version="v9", stop_when=(StepCount(count=5),))
    a = apply(None, RunStarted(run_id="a", ts=1, agent="x", policy=policy), 1).state
    b = apply(None, RunStarted(run_id="b", ts=1, agent="x", policy=msgspec.structs.replace(policy)), 1).state
    assert decode_state(encode_state(a)).policy is decode_state(encode_state(b)).policy


def test_encoded_fleet_states_are_small() -> None:
    """Every state of a simulated fleet encodes to well under 400 bytes, and round-trips."""
    from loopwarden.codecs import decode_input

    states = _states_after(decode_input(m.value) for m in sim_fleet(600, seed=3) if m.valid)
    sizes = sorted(len(encode_state(s)) for s in states)
    assert all(decode_state(encode_state(s)) == s for s in states)
    assert sizes[len(sizes) // 2] <= 300, sizes[len(sizes) // 2]
    assert sizes[-1] <= 600, sizes[-1]


def test_a_long_run_encodes_as_small_as_a_short_one() -> None:
    """10,000 steps leave the encoded state a few bytes bigger than 10 do."""
    def after(n: int) -> RunState:
        state = apply(None, RunStarted(run_id="big", ts=0, agent="a", policy=Policy(version="v", stop_when=())), 0).state
        for i in range(n):
            ev = StepFinished(run_id="big", ts=i, step=i, finish_reason="tool-calls",
                              tool_calls=(ToolCall(id=f"tc-{i}", name="lookup", status="result"),),
                              usage=Usage(total_tokens=100))
            state = apply(state, ev, i).state
        return state

    small, big = encode_state(after(10)), encode_state(after(10_000))
    assert len(big) <= len(small) + 16, (len(small), len(big))
    assert decode_state(big).open[0].steps_seen == 10_000


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", "empty"),
        (b"\x00" + msgspec.msgpack.encode(["r"]), "unknown encoded state format version 0"),
        (b"\x7f", "unknown encoded state format version 127"),
        (b"{\"run_id\": \"r\"}", "unknown encoded state format version 123"),
        (bytes([VERSION]), "invalid encoded state (version 1)"),
        (bytes([VERSION]) + b"\xc1garbage", "invalid encoded state (version 1)"),
        (bytes([VERSION]) + msgspec.msgpack.encode({"run_id": "r"}), "invalid encoded state (version 1)"),
        (bytes([VERSION]) + msgspec.msgpack.encode(["r", 9999]), "unknown word number 9999"),
    ],
)
def test_bad_bytes_raise_a_value_error_naming_the_problem(data: bytes, message: str) -> None:
    """decode_state and decode_listing (the read index's) refuse bad bytes with a ValueError naming the problem."""
    for decode in (decode_state, decode_listing):
        with pytest.raises(ValueError, match=None) as info:
            decode(data)
        assert message in str(info.value) or (decode is decode_listing and "invalid encoded state" in str(info.value))


def test_truncated_bytes_are_rejected() -> None:
    """Every strict prefix of a valid encoding is an error, never a different state."""
    state = _states_after([RunStarted(run_id="r", ts=5, agent="a", policy=Policy(version="v"))])[0]
    data = encode_state(state)
    for n in range(1, len(data)):
        with pytest.raises(ValueError):
            decode_state(data[:n])
