"""The core's inlined copies agree with the functions they copy, on generated inputs.

``machine.py`` keeps four copies on its hot path, each with a comment naming what it saves
(measured: docs/architecture.md, "Hot paths"): the RUNNING inactivity deadline
(``_run_deadline``) inside ``apply``, ``receipt_verdict``'s rule without required kinds
inside ``_receipts_verdict``, and ``_activity`` and ``Usage.tokens`` inside the step
handler; ``table.py`` one, ``next_deadline`` as ``RunTable.deadline``. Each is checked here
against the original, and ``apply_into`` on a reused ``Result`` against ``apply``.
"""

from __future__ import annotations

import copy

from hypothesis import given, settings
from hypothesis import strategies as st

from loopwarden.codecs import RECEIPT_KINDS, STATES, Policy, StepFinished
from loopwarden.rules import Settings, apply, fire_next, next_deadline, receipt_verdict
from loopwarden.rules.conditions import compile_policy, intern_policy
from loopwarden.rules.machine import Result, RunState, _activity, _receipts_verdict, _run_deadline, apply_into
from loopwarden.rules.table import RunTable
from tests import strategies as S

kinds = st.lists(st.sampled_from(RECEIPT_KINDS), max_size=4, unique=True)
maybe_ts = st.none() | S.ts
healths = st.none() | st.sampled_from(STATES)


@settings(max_examples=400, deadline=None)
@given(kinds, kinds, st.none() | S.policies)
def test_receipts_verdict_copy_equals_receipt_verdict(verified, negative, policy) -> None:
    """_receipts_verdict (inline rule when no kinds are required) says what receipt_verdict says."""
    state = RunState("r", policy=policy, verified_kinds=verified, negative_kinds=negative)
    required = policy.required_outcomes if policy is not None else ()
    assert _receipts_verdict(state) == receipt_verdict(verified, negative, required)


@settings(max_examples=400, deadline=None)
@given(S.policies, maybe_ts)
def test_applys_running_deadline_copy_equals_run_deadline(policy, last_activity) -> None:
    """apply's RUNNING deadline (last activity + the compiled policy's inactivity) is _run_deadline's."""
    policy = intern_policy(policy)
    state = RunState("r", health="RUNNING", policy=policy, last_activity_ts=last_activity)
    copied = None if last_activity is None else last_activity + compile_policy(policy).inactivity_ms
    assert copied == _run_deadline(state)


@settings(max_examples=400, deadline=None)
@given(healths, maybe_ts, S.ts, S.step_finished, st.none() | S.ts)
def test_the_step_handlers_activity_copy_equals_activity(health, last_activity, last_seen, step, clock) -> None:
    """A step moves last_activity_ts / last_seen_ts (placed at the clock if later) and starts a run exactly as _activity does."""
    state = RunState("r", health=health, last_activity_ts=last_activity, last_seen_ts=last_seen,
                     policy=intern_policy(Policy(version="v", inactivity_timeout_s=1e9)))
    ev = StepFinished(run_id="r", ts=step.ts, step=step.step, segment=step.segment,
                      finish_reason=step.finish_reason, tool_calls=step.tool_calls, usage=step.usage)
    by_copy = apply(copy.deepcopy(state), ev, 5, clock)
    ref = copy.deepcopy(state)
    res = Result(ref)
    _activity(ref, res, ev.ts, 5, ev.ts if clock is None else max(ev.ts, clock))
    assert (by_copy.state.last_activity_ts, by_copy.state.last_seen_ts) == (ref.last_activity_ts, ref.last_seen_ts)
    if health is None:  # the run starts: the same first transition (the step's own moves come after)
        assert by_copy.transitions[0] == res.transitions[0]


@settings(max_examples=400, deadline=None)
@given(S.step_finished)
def test_the_step_handlers_token_copy_equals_usage_tokens(step) -> None:
    """A run's first step adds exactly Usage.tokens to its segment."""
    state = apply(None, step, 0).state
    assert state.open[step.segment].tokens == step.usage.tokens


@settings(max_examples=600, deadline=None)
@given(st.none() | S.policies, st.integers(0, 52), st.data())
def test_the_compiled_policys_evaluate_equals_evaluate(policy, steps, data) -> None:
    """CompiledPolicy.evaluate (lookup tables) fires what conditions.evaluate over the policy's conditions fires."""
    from loopwarden.codecs import ToolCall, TokenBudget, ToolCallCondition
    from loopwarden.rules.conditions import conditions_of, evaluate

    conditions = conditions_of(policy)
    names = [t for c in conditions if isinstance(c, ToolCallCondition) for t in c.tools] + ["other"]
    budgets = [c.max_tokens for c in conditions if isinstance(c, TokenBudget)] or [1]
    tokens = data.draw(st.sampled_from(budgets).flatmap(lambda b: st.integers(max(0, b - 2), b + 2)) | st.integers(0, 2**41))
    calls = [ToolCall(id=f"c{i}", name=name, status="result")
             for i, name in enumerate(data.draw(st.lists(st.sampled_from(names), max_size=4)))]
    assert compile_policy(policy).evaluate(steps, tokens, calls) == evaluate(conditions, steps, tokens, [c.name for c in calls])


settings_values = st.builds(Settings, retention_s=S.durations, seq_memory_s=S.durations)


@settings(max_examples=300, deadline=None)
@given(S.fleet(), settings_values, st.integers(0, 40 * 86400_000))
def test_the_run_tables_deadline_copy_equals_next_deadline(events, knobs, later) -> None:
    """RunTable.deadline (next_deadline in one call) gives next_deadline's deadline for every state a fleet passes through."""
    table = RunTable(knobs, {}.get)
    states = {}
    for ev in events:
        state = states[ev.run_id] = apply(states.get(ev.run_id), ev, ev.ts, ev.ts).state
        assert table.deadline(state) == next_deadline(state, knobs)
    for state in list(states.values()):  # and after their timers fired: retention, tombs
        while (res := fire_next(state, state.last_seen_ts + later, knobs)).state is not None and res.state is not state:
            state = res.state
            assert table.deadline(state) == next_deadline(state, knobs)
        assert table.deadline(state) == next_deadline(state, knobs)


@settings(max_examples=300, deadline=None)
@given(S.fleet())
def test_apply_into_one_result_equals_apply(events) -> None:
    """apply_into on one Result taken out after each event (as the shells do) gives what apply gives on a new one."""
    res = Result(None)
    ours: dict = {}
    ref: dict = {}
    for ev in events:
        expected = apply(copy.deepcopy(ref.get(ev.run_id)), ev, ev.ts, ev.ts)
        ref[ev.run_id] = expected.state
        ours[ev.run_id] = apply_into(res, ours.get(ev.run_id), ev, ev.ts, ev.ts)
        transitions, notes = res.transitions, list(res.notes)
        res.transitions = []
        res.notes.clear()
        assert (ours[ev.run_id], transitions, notes) == (expected.state, expected.transitions, expected.notes)
