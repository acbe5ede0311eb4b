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
from loopwarden.rules.codec import V1, VERSION, WORDS, _encode_v1, decode_listing
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
        back = decode_state(data, state.run_id)
        assert back == state
        assert msgspec.structs.asdict(back) == msgspec.structs.asdict(state)
        assert encode_state(back) == data  # a decoded state encodes to the same bytes
        assert decode_listing(data, state.run_id) == _listing(state)
        old = _encode_v1(state)  # format 1, as states already in changelogs hold it
        assert decode_state(old, state.run_id) == state and decode_state(old) == state
        assert decode_listing(old, state.run_id) == _listing(state)


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
    assert decode_state(encode_state(state), state.run_id) == state
    assert decode_state(_encode_v1(state)) == state


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
    assert decode_state(encode_state(state), "r") == state


def test_decoded_policies_are_shared() -> None:
    """Runs with equal policies hold one Policy object once decoded (memory follows policies, not runs)."""
    policy = Policy(version="v9", stop_when=(StepCount(count=5),))
    a = apply(None, RunStarted(run_id="a", ts=1, agent="x", policy=policy), 1).state
    b = apply(None, RunStarted(run_id="b", ts=1, agent="x", policy=msgspec.structs.replace(policy)), 1).state
    assert decode_state(encode_state(a), "a").policy is decode_state(encode_state(b), "b").policy


def test_encoded_fleet_states_are_small() -> None:
    """Every state of a simulated fleet encodes to well under 400 bytes, and round-trips."""
    from loopwarden.codecs import decode_input

    states = _states_after(decode_input(m.value) for m in sim_fleet(600, seed=3) if m.valid)
    sizes = sorted(len(encode_state(s)) for s in states)
    assert all(decode_state(encode_state(s), s.run_id) == s for s in states)
    assert not any(s.run_id.encode() in encode_state(s) for s in states)  # the key, receipt ids' included, is not repeated
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
    assert decode_state(big, "big").open[0].steps_seen == 10_000


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", "empty"),
        (b"\x00" + msgspec.msgpack.encode(["r"]), "unknown encoded state format version 0"),
        (b"\x7f", "unknown encoded state format version 127"),
        (b"{\"run_id\": \"r\"}", "unknown encoded state format version 123"),
        (b"\x03" + msgspec.msgpack.encode([1]), "unknown encoded state format version 3"),
        (bytes([V1]), "invalid encoded state (version 1)"),
        (bytes([V1]) + b"\xc1garbage", "invalid encoded state (version 1)"),
        (bytes([V1]) + msgspec.msgpack.encode({"run_id": "r"}), "invalid encoded state (version 1)"),
        (bytes([V1]) + msgspec.msgpack.encode(["r", 9999]), "unknown word number 9999"),
        (bytes([VERSION]), "invalid encoded state (version 2)"),
        (bytes([VERSION]) + b"\xc1garbage", "invalid encoded state (version 2)"),
        (bytes([VERSION]) + msgspec.msgpack.encode({"health": 1}), "invalid encoded state (version 2)"),
        (bytes([VERSION]) + msgspec.msgpack.encode([9999]), "invalid encoded state (version 2): Expected `int` <="),
    ],
)
def test_bad_bytes_raise_a_value_error_naming_the_problem(data: bytes, message: str) -> None:
    """decode_state and decode_listing (the read index's) refuse bad bytes with a ValueError naming the problem."""
    for decode in (decode_state, decode_listing):
        with pytest.raises(ValueError, match=None) as info:
            decode(data, "r")
        assert message in str(info.value) or (decode is decode_listing and "invalid encoded state" in str(info.value))


def test_a_bad_policy_in_version_two_is_named() -> None:
    """Format 2 keeps the policy as bytes looked up by value: bad ones are still refused, naming the policy."""
    with pytest.raises(ValueError, match=r"invalid encoded state \(version 2\): policy"):
        decode_state(bytes([VERSION]) + msgspec.msgpack.encode([None, 0, None, 5]), "r")


def test_truncated_bytes_are_rejected() -> None:
    """Every strict prefix of a valid encoding is an error, never a different state."""
    state = _states_after([RunStarted(run_id="r", ts=5, agent="a", policy=Policy(version="v"))])[0]
    for data in (encode_state(state), _encode_v1(state)):
        for n in range(1, len(data)):
            with pytest.raises(ValueError):
                decode_state(data[:n], "r")


def test_version_one_bytes_written_by_the_old_encoder_still_decode() -> None:
    """Golden format-1 bytes (written by main's encoder at 4359c13) decode to their states, with or without
    the key, and re-encode as format 2 to the same state; the read index lists them alike."""
    import json
    from pathlib import Path

    golden = json.loads((Path(__file__).parents[1] / "vectors" / "state-v1-golden.json").read_text())["states"]
    assert len(golden) >= 9 and any(g["state"].get("approval") for g in golden) and any(g["state"].get("tomb") for g in golden)
    for g in golden:
        data, state = bytes.fromhex(g["v1"]), msgspec.convert(g["state"], RunState)
        assert data[0] == V1
        assert decode_state(data) == state and decode_state(data, state.run_id) == state
        # The encoder kept as format 2's fallback is format 1's: the same fields, fields added since after them.
        old_fields = msgspec.msgpack.decode(data[1:])
        assert msgspec.msgpack.decode(_encode_v1(state)[1:])[:len(old_fields)] == old_fields
        assert decode_listing(data, state.run_id) == _listing(state)
        assert decode_state(encode_state(state), state.run_id) == state
        assert len(encode_state(state)) < len(data)


def test_version_two_needs_the_run_id() -> None:
    """A format-2 state decoded without its key fails loudly, naming the version; it never invents a run id."""
    state = _states_after([RunStarted(run_id="run-1", ts=1780000000000, agent="a", policy=Policy(version="v"))])[0]
    data = encode_state(state)
    for decode in (decode_state, decode_listing):
        for missing in (None, b"run-1"):
            with pytest.raises(ValueError, match="format version 2 decoded without its run id"):
                decode(data, missing)  # type: ignore[arg-type]


def test_ids_holding_the_run_id_and_far_times_are_exact() -> None:
    """Ids that hold the run id (once, twice, at either end, or a short run id) and times far from
    last_seen_ts (beyond 64 bits apart: written as format 1) all come back exactly."""
    rid = "run-7"
    ids = [f"rc-{rid}-1", rid, f"{rid}{rid}", f"x{rid}", f"{rid}y", "other", ""]
    state = RunState(run_id=rid, health="VERIFYING", last_seen_ts=1780000000000, last_activity_ts=0,
                     verify_deadline_ts=1780000600000, receipt_ids=ids, untrusted_receipt_ids=ids[:3],
                     expectation_ids=ids[3:], history=[(1, -5, "RUNNING", "started")],
                     approval=Approval(approval_id=f"ap-{rid}", tool_call_id=f"{rid}-tc", tool_name="n",
                                       deadline_ts=1780000000001, resume_token=f"tok-{rid}"))
    data = encode_state(state)
    assert data[0] == VERSION and data.count(rid.encode()) == 2  # only the second of "run-7run-7" (in two lists)
    assert decode_state(data, rid) == state
    short = msgspec.structs.replace(state, run_id="r", receipt_ids=["r", "rr", "xr"])
    assert decode_state(encode_state(short), "r") == short
    far = msgspec.structs.replace(state, last_seen_ts=2**63 - 1, last_activity_ts=-(2**63))
    assert encode_state(far)[0] == V1 and decode_state(encode_state(far), rid) == far
