"""The core's inlined copies agree with the functions they copy, on generated inputs.

``machine.py`` keeps two copies on its hot path, each with a comment naming what it saves
(measured: docs/architecture.md, "Hot paths"): the RUNNING inactivity deadline
(``_run_deadline``) inside ``apply``, and ``receipt_verdict``'s rule without required
kinds inside ``_receipts_verdict``. Each is checked here against the original. (The
step handler's copies of ``_activity`` and ``Usage.tokens`` saved ~2.5 % together, within
the noise: they are calls again.)
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from loopwarden.codecs import RECEIPT_KINDS
from loopwarden.rules import receipt_verdict
from loopwarden.rules.conditions import compile_policy, intern_policy
from loopwarden.rules.machine import RunState, _receipts_verdict, _run_deadline
from tests import strategies as S

kinds = st.lists(st.sampled_from(RECEIPT_KINDS), max_size=4, unique=True)
maybe_ts = st.none() | S.ts


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
