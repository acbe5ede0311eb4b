"""Bounded recovery through the rules core (docs/recovery.md): runs replayed on an event-time clock decide
their actions, a person's signed operator action becomes one, and the state keeps what recovery needs."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from loopwarden.codecs import decode_input
from loopwarden.codecs.events import OperatorAction, RecoveryAction, RecoveryPolicy
from loopwarden.replay import Replay
from loopwarden.rules.codec import _State2, _State2R, decode_state, encode_state
from loopwarden.rules.machine import evidence_of
from loopwarden.stages.health.recoverypolicies import RecoveryPoliciesError, load_policies, parse_policies
from loopwarden.trust import SigningKey, TrustedVerifiers
from tests.builders import ended, started, step, timed

RESUME3 = {"max_attempts": 3, "on": {"STUCK": "resume"}}
KEY = SigningKey.generate("ops-1")
TRUSTED = TrustedVerifiers.parse(KEY.setting)


def replay(events: list[dict], advance_s: float = 0, defaults: dict | None = None, verifiers=None
           ) -> tuple[Replay, list[dict], list[RecoveryAction]]:
    actions: list[RecoveryAction] = []
    r = Replay(recovery_defaults={a: msgspec.convert(p, RecoveryPolicy) for a, p in (defaults or {}).items()},
               verifiers=verifiers, on_action=actions.append)
    out = []
    for e in events:
        out += r.feed(decode_input(msgspec.json.encode(e)))
    out += r.finish(advance_s)
    return r, [msgspec.to_builtins(t) for t in out], actions


def op(action: str, request_id: str = "q1", run: str = "r", ts: int = 0, sign: bool = True, **fields: Any) -> dict:
    ev = OperatorAction(run_id=run, ts=ts, request_id=request_id, action=action, reason="checked the tool",  # type: ignore[arg-type]
                        **fields)
    return msgspec.to_builtins(KEY.sign_action(ev) if sign else ev)


def hangs(run: str = "r", recovery: dict | None = None, **job: Any) -> list[dict]:
    """A run whose tool never answers: STUCK once the inactivity timeout (60 s) passes."""
    start = started(run=run, inactivity_timeout_s=60, **({"recovery": recovery} if recovery else {}))
    start.update(job)
    return timed(start, step(0, ("lookup", "result"), run=run))


def test_a_stuck_run_with_a_resume_policy_publishes_one_resume() -> None:
    """STUCK under `on: {STUCK: resume}` gives one resume to attempt 2, and the transition names it."""
    _, out, actions = replay(hangs(recovery=RESUME3, job_id="inv-42", attempt=1), advance_s=600)
    assert [a.action for a in actions] == ["resume"]
    a = actions[0]
    stuck = out[-1]
    assert stuck["to_state"] == "STUCK"
    assert (a.action_id, a.job_id, a.attempt, a.next_attempt) == (f"r:{stuck['seq']}", "inv-42", 1, 2)
    assert a.agent == stuck["agent"] == "agent", "the action names the run's agent"
    assert a.decided_by == "policy:v1" and a.reason == "STUCK:no_progress"
    assert stuck["evidence"]["action_id"] == a.action_id
    assert (stuck["evidence"]["job_id"], stuck["evidence"]["attempt"]) == ("inv-42", 1)


def test_a_run_without_a_job_keeps_its_evidence_bytes() -> None:
    """A run that declares no job and has no recovery policy carries no job, attempt nor action in evidence."""
    _, out, actions = replay(hangs(), advance_s=600)
    assert actions == []
    assert all(k not in t["evidence"] for t in out for k in ("job_id", "attempt", "action_id"))


def test_the_last_attempt_escalates_with_attempts_exhausted() -> None:
    """At attempt == max_attempts a resume becomes one escalate, reason attempts_exhausted."""
    _, _, actions = replay(hangs(recovery=RESUME3, job_id="inv-42", attempt=3, recovers="r2"), advance_s=600)
    assert [(a.action, a.reason, a.next_attempt) for a in actions] == [("escalate", "attempts_exhausted", None)]


def test_the_agents_default_policy_applies_and_the_runs_own_comes_first() -> None:
    """A run without policy.recovery takes its agent's default (or `*`'s); one with its own keeps it."""
    _, _, by_default = replay(hangs(), advance_s=600, defaults={"agent": RESUME3})
    _, _, by_any = replay(hangs(), advance_s=600, defaults={"*": RESUME3})
    _, _, own = replay(hangs(recovery={"on": {"STUCK": "escalate"}}), advance_s=600, defaults={"agent": RESUME3})
    _, _, other = replay(hangs(), advance_s=600, defaults={"another-agent": RESUME3})
    assert [a.action for a in by_default] == [a.action for a in by_any] == ["resume"]
    assert [a.action for a in own] == ["escalate"]
    assert other == []


def test_failed_over_a_tool_not_declared_idempotent_escalates() -> None:
    """FAILED restarts only when each failed tool is idempotent; else it escalates, never restarts."""
    policy = {"max_attempts": 2, "on": {"FAILED": "restart"}, "idempotent_tools": ["fetch"]}
    def failing(tool: str) -> list[dict]:
        return timed(started(recovery=policy), step(0, (tool, "error")), ended("tool_error", 1))
    _, out_ok, safe = replay(failing("fetch"))
    _, _, unsafe = replay(failing("charge_card"))
    assert out_ok[-1]["to_state"] == "FAILED"
    assert [(a.action, a.next_attempt) for a in safe] == [("restart", 2)]
    assert [(a.action, a.reason) for a in unsafe] == [("escalate", "FAILED:not_idempotent")]


def test_a_tool_error_whose_call_never_arrived_escalates_never_restarts() -> None:
    """run_ended reports tool_error but the failed step never arrived (its loss told only after run_ended): no
    declared tool vouches for the call, so FAILED escalates (FAILED:not_idempotent)."""
    policy = {"max_attempts": 2, "on": {"FAILED": "restart"}, "idempotent_tools": ["fetch"]}
    events = timed(started(recovery=policy), ended("tool_error", 1))
    events.append({"type": "events_dropped", "run_id": "r", "ts": events[-1]["ts"] + 100, "count": 1})
    _, out, actions = replay(events)
    assert [t["to_state"] for t in out] == ["RUNNING", "FAILED", "UNCERTAIN"]
    assert [(a.action, a.reason) for a in actions] == [("escalate", "FAILED:not_idempotent")]


def test_one_automatic_action_per_attempt() -> None:
    """A run that moves again after its action and stalls again gets no second automatic action."""
    events = hangs(recovery=RESUME3)
    events += timed(step(1, ("lookup", "result")), start=events[-1]["ts"] + 120_000)
    _, out, actions = replay(events, advance_s=600)
    assert [t["to_state"] for t in out].count("STUCK") == 2
    assert len(actions) == 1


def test_a_signed_retry_becomes_a_restart_decided_by_the_person() -> None:
    """A retry signed by a trusted key is a restart decided by `person:<key>/<actor>`, with its own action id."""
    events = hangs(recovery={"max_attempts": 2})
    events.append(op("retry", ts=events[-1]["ts"] + 200_000, actor="ana@example.com"))
    r, _, actions = replay(events, advance_s=600, verifiers=TRUSTED)
    assert [(a.action, a.decided_by, a.next_attempt, a.action_id, a.reason) for a in actions] == [
        ("restart", "person:ops-1/ana@example.com", 2, "r:op:q1", "checked the tool")]
    assert r.notes[("operator_action", "applied")] == 1


@pytest.mark.parametrize("why, events_of, verifiers", [
    ("unsigned", lambda e: [op("retry", ts=e[-1]["ts"], sign=False)], TRUSTED),
    ("unsigned", lambda e: [op("retry", ts=e[-1]["ts"], sign=False)], None),
    ("unknown_key", lambda e: [op("retry", ts=e[-1]["ts"])], TrustedVerifiers.parse(SigningKey.generate("x").setting)),
    ("bad_signature", lambda e: [{**op("retry", ts=e[-1]["ts"]), "reason": "changed after signing"}], TRUSTED),
    ("stale", lambda e: [op("retry", ts=e[-1]["ts"], run_started_ts=e[0]["ts"] - 1)], TRUSTED),
    ("repeated", lambda e: [op("retry", ts=e[-1]["ts"], override_bound=True),
                            op("retry", ts=e[-1]["ts"] + 1, override_bound=True)], TRUSTED),
    ("attempts_exhausted", lambda e: [op("retry", ts=e[-1]["ts"])], TRUSTED),
    ("closed", lambda e: [op("abandon", "q0", ts=e[-1]["ts"]), op("retry", ts=e[-1]["ts"] + 1, override_bound=True)],
     TRUSTED),
])
def test_a_refused_operator_action_changes_nothing_and_is_counted(why: str, events_of, verifiers) -> None:
    """Unsigned, untrusted, stale, repeated, out-of-bound or closed: no restart, counted by reason and in evidence."""
    events = hangs()
    r, _, actions = replay(events + events_of(events), verifiers=verifiers)
    assert "restart" not in [a.action for a in actions][1:] and len([a for a in actions if a.action == "restart"]) <= 1
    assert r.notes[("operator_action", why)] == 1
    assert evidence_of(r.states["r"]).ignored["refused_operator_action"] == 1


def test_an_override_retries_beyond_the_bound_and_records_it() -> None:
    """A person's retry with override_bound goes past max_attempts, and the action says so."""
    events = hangs()
    r, _, actions = replay(events + [op("retry", ts=events[-1]["ts"], override_bound=True)], verifiers=TRUSTED)
    assert [(a.action, a.override_bound, a.next_attempt) for a in actions] == [("restart", True, 2)]


def test_an_operator_action_for_an_unknown_run_is_counted_not_applied() -> None:
    """An operator action naming a run loopwarden does not hold makes no run and no action."""
    r, out, actions = replay([op("retry", run="ghost", ts=5)], verifiers=TRUSTED)
    assert (out, actions, r.states, r.unknown_run_actions) == ([], [], {}, 1)
    assert r.notes[("operator_action", "unknown_run")] == 1


def test_abandon_stops_the_automatic_action_and_is_published_as_a_record() -> None:
    """After a person's abandon the run's STUCK calls for nothing; the abandon itself is on agent.actions."""
    events = timed(started(recovery=RESUME3, inactivity_timeout_s=60), step(0, ("lookup", "result")))
    events.append(op("abandon", ts=events[-1]["ts"] + 1))
    r, out, actions = replay(events, advance_s=600, verifiers=TRUSTED)
    assert out[-1]["to_state"] == "STUCK"
    assert [(a.action, a.decided_by, a.agent) for a in actions] == [("abandon", "person:ops-1", "agent")]
    assert r.states["r"].recovery.closed_by == "person:ops-1"


def test_acknowledge_records_who_took_the_run() -> None:
    """An acknowledge is kept in the run's state and published as a record with nothing to start."""
    events = hangs()
    r, _, actions = replay(events + [op("acknowledge", ts=events[-1]["ts"])], advance_s=600, verifiers=TRUSTED)
    assert [(a.action, a.next_attempt) for a in actions] == [("acknowledge", None)]
    assert r.states["r"].recovery.acknowledged_by == "person:ops-1"


def test_a_state_with_recovery_survives_the_codec_and_one_without_keeps_its_bytes() -> None:
    """The recovery record and a policy's recovery round-trip; a state without them encodes as before."""
    events = hangs(recovery=RESUME3, job_id="inv-42", attempt=2, recovers="r1")
    events.append(step(1, ("charge_card", "error")))
    r, _, _ = replay(events)
    state = r.states["r"]
    assert state.recovery is not None and state.recovery.failed_tools == ["charge_card"]
    assert decode_state(encode_state(state), "r") == state
    assert len(msgspec.msgpack.decode(encode_state(state)[1:])) == len(_State2R.__struct_fields__)
    plain = replay(hangs())[0].states["r"]
    encoded = encode_state(plain)
    assert decode_state(encoded, "r") == plain
    assert len(msgspec.msgpack.decode(encoded[1:])) == len(_State2.__struct_fields__)  # no recovery element


def test_a_run_keeps_no_recovery_record_until_its_policy_needs_one() -> None:
    """Under a default policy a run none of whose transitions it answers stores no record; a failed call or an
    action makes one, and the failed call still counts for the idempotence rule."""
    policy = {"max_attempts": 2, "on": {"FAILED": "restart"}, "idempotent_tools": ["fetch"]}
    finished = timed(started(), step(0, ("lookup", "result")), step(1), ended("natural_finish", 2))
    r, _, actions = replay(finished, defaults={"*": policy})
    assert actions == [] and r.states["r"].recovery is None
    assert r.states["r"].policy.recovery == msgspec.convert(policy, RecoveryPolicy), "the default is still fixed"
    failing = timed(started(), step(0, ("charge_card", "error")), step(1), ended("natural_finish", 2))
    r, _, _ = replay(failing, defaults={"*": policy})
    assert r.states["r"].recovery is not None and r.states["r"].recovery.failed_tools == ["charge_card"]
    r, _, actions = replay(timed(started(), step(0, ("charge_card", "error")), ended("tool_error", 1)),
                           defaults={"*": policy})
    assert [(a.action, a.reason) for a in actions] == [("escalate", "FAILED:not_idempotent")]
    assert r.states["r"].recovery.acted


# run-0042, whose lookup failed once (no job declared: its recovery record names the failed tool), stored with its
# recovery policy in the wire's map form (still read: states already in changelogs).
MAP_FORM_POLICY = {"max_attempts": 3, "on": {"STUCK": "resume", "FAILED": "restart"}, "backoff_s": 30,
                   "idempotent_tools": ["lookup"], "escalate_to": "oncall",
                   "next_policy": {"version": "v2", "inactivity_timeout_s": 120}}
MAP_FORM = bytes.fromhex(
    "02dc00200001a56167656e7496a2763192920014920191a4646f6e65cb404e000000000000c09086ac6d61785f617474656d"
    "70747303a26f6e82a5535455434ba6726573756d65a64641494c4544a772657374617274a96261636b6f66665f73cb403e00"
    "0000000000ab6e6578745f706f6c69637985a776657273696f6ea27632a973746f705f7768656ec0b4696e61637469766974"
    "795f74696d656f75745f73cb405e000000000000b0726563656970745f77696e646f775f73cb4082c00000000000b1726571"
    "75697265645f6f7574636f6d657390b06964656d706f74656e745f746f6f6c7391a66c6f6f6b7570ab657363616c6174655f"
    "746fa66f6e63616c6c00ce000f462881009c010090c20f01c016911190ffc0900001c0c0909000c0c0c2c090909080919401"
    "d1fc180025c200909080d1fc189099c001c091a66c6f6f6b757001c2c0c090")


def test_a_state_keeps_its_recovery_policy_as_an_array_and_still_reads_the_map_form() -> None:
    """A stored recovery policy is an array of numbers (a default policy is in every state); a state stored with
    the map form decodes to the same policy and is written back shorter."""
    state = decode_state(MAP_FORM, "run-0042")
    assert state.policy.recovery == msgspec.convert(MAP_FORM_POLICY, RecoveryPolicy)
    assert (state.recovery.job_id, state.recovery.failed_tools, state.tool_errors) == (None, ["lookup"], 1)
    again = encode_state(state)
    assert decode_state(again, "run-0042") == state
    assert len(again) < len(MAP_FORM) / 2, (len(MAP_FORM), len(again))


def test_replay_decides_the_same_actions_with_and_without_the_codec_in_between() -> None:
    """Decoding a stored state mid-run changes no decision (the worker stores states between batches)."""
    events = hangs(recovery=RESUME3, job_id="inv-42")
    r, _, _ = replay(events[:1])
    state = r.states["r"]
    assert decode_state(encode_state(state), "r").policy.recovery == msgspec.convert(RESUME3, RecoveryPolicy)


@pytest.mark.parametrize("text, named", [
    ('{"invoice": {"max_attempt": 3}}', "unknown field `max_attempt`"),
    ('{"invoice": {"max_attempts": 0}}', "$.max_attempts"),
    ('{"invoice": {"on": {"UNCERTAIN": "restart"}}}', "`on.UNCERTAIN`"),
    ('{"invoice": {"on": {"STUCK": "rerun"}}}', "$.on"),
    ('{"invoice": {"next_policy": {"version": "v", "stop_when": 3}}}', "$.next_policy.stop_when"),
])
def test_a_bad_recovery_policies_file_is_refused_naming_the_agent_and_field(text: str, named: str) -> None:
    """Each bad policy is refused with one line naming the file, the agent and the field."""
    with pytest.raises(RecoveryPoliciesError) as info:
        parse_policies(text, "policies.json")
    message = str(info.value)
    assert "\n" not in message and message.startswith("policies.json: agent 'invoice': ") and named in message


def test_a_toml_policies_file_maps_agents_to_policies(tmp_path) -> None:
    """A .toml file reads as the JSON one does."""
    path = tmp_path / "recovery.toml"
    path.write_text('[invoice]\nmax_attempts = 3\nbackoff_s = 30\n[invoice.on]\nSTUCK = "resume"\n')
    assert load_policies(path) == {"invoice": RecoveryPolicy(max_attempts=3, backoff_s=30, on={"STUCK": "resume"})}
