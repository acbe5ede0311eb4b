"""Differential test: loopwarden's stop-condition evaluation against the real `ai` package.

`emitters/ai-sdk/test/oracle/sdk-oracle.mjs` generates seeded random content-free step
sequences and policies, runs them through the installed SDK (its real isStepCount,
hasToolCall, isLoopFinished and the emitter's tokenBudget, and the SDK's own loop to
see when it evaluates stopWhen), and prints what the SDK answered for every prefix.
Python must give identical answers, including "not evaluated on this step".
"""

from __future__ import annotations

import json
import os
import subprocess

import msgspec
import pytest

from loopwarden.codecs import Condition, StepFinished
from loopwarden.rules.conditions import conditions_of, evaluate, is_evaluated
from loopwarden.codecs.events import Policy
from tests.e2e.test_ai_sdk_agents import EMITTER, _built, _node

pytestmark = pytest.mark.e2e
CASES = int(os.environ.get("LOOPWARDEN_ORACLE_CASES", "4000"))


@pytest.mark.parametrize("seed", [1, 7])
def test_python_evaluation_equals_the_sdk(seed: int) -> None:
    """For thousands of random cases, every prefix: evaluated-or-not and the fired ids agree."""
    node = _node()
    _built(node)
    proc = subprocess.run([node, "test/oracle/sdk-oracle.mjs", "--seed", str(seed), "--cases", str(CASES)],
                          cwd=EMITTER, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "NODE_NO_WARNINGS": "1"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    assert len(lines) == CASES
    checked = evaluated = fired_any = steered_text_only = 0
    mismatches = []
    for line in lines:
        case = json.loads(line)
        conditions = conditions_of(Policy(version="oracle", stop_when=msgspec.convert(case["stop_when"], tuple[Condition, ...])))
        tokens = 0
        for ev in case["evaluations"]:
            k = ev["step"]
            step = msgspec.convert({**case["steps"][k], "type": "step_finished", "run_id": "o", "ts": 0, "step": k},
                                   StepFinished)
            tokens += step.usage.tokens
            steered = case["steps"][k].get("steered", False)
            steered_text_only += steered and not step.tool_calls and ev["evaluated"]
            mine_evaluated = is_evaluated(step, steered)
            mine_fired = list(evaluate(conditions, k + 1, tokens, [tc.name for tc in step.tool_calls]))
            checked += 1
            evaluated += ev["evaluated"]
            fired_any += bool(ev["fired"])
            if (mine_evaluated, mine_fired) != (ev["evaluated"], sorted(ev["fired"])):
                mismatches.append((case["case"], k, (mine_evaluated, mine_fired), (ev["evaluated"], ev["fired"])))
    assert not mismatches, f"{len(mismatches)} of {checked} prefixes differ, first: {mismatches[:5]}"
    # the generator must exercise both sides of every question
    assert checked > CASES and 0 < evaluated < checked and 0 < fired_any < checked
    if _sdk_has_steering():  # ai >= 7.0.154: steered steps without tool calls are evaluated too
        assert steered_text_only > 0
    print(f"oracle seed {seed}: {CASES} cases, {checked} prefixes, {evaluated} evaluated, "
          f"{steered_text_only} of them steered without tool calls, 0 disagreements")


def _sdk_has_steering() -> bool:
    proc = subprocess.run([_node(), "-e", "import('ai').then(m => console.log(typeof m.experimental_createSteering))"],
                          cwd=EMITTER, capture_output=True, text=True, timeout=60)
    return proc.stdout.strip() == "function"


# -- whole runs: what a user sees, against what the SDK did ------------------------------------------
RUNS = int(os.environ.get("LOOPWARDEN_RUN_ORACLE_RUNS", "2000"))


def _expected_cause(seg: dict) -> str:
    """The boundary cause from what the SDK showed (observed by the oracle, not by the emitter)."""
    rejected = seg["rejected"]
    if rejected:
        if rejected["name"] == "TimeoutError":
            return "timeout"
        return "aborted" if rejected["aborted"] or rejected["name"] == "AbortError" else "error"
    statuses = seg["last_statuses"]
    if seg["steps"] == 0:
        return "unknown"
    if "approval_requested" in statuses:
        return "approval_required"
    if seg["last_finish"] == "error":  # docs/contract.md section 5, derived-cause rule 3: the provider failed mid-step
        return "error"
    if "error" in statuses:
        return "tool_error"
    if seg["evaluated_at_last"]:
        return "stop_condition" if seg["fired_at_last"] else "unknown"
    if not statuses or seg["last_finish"] not in ("stop", "tool-calls"):
        return "natural_finish"
    return "unexecuted_tool" if "pending" in statuses else "unknown"


def _expected_state(fact: dict) -> str:
    """docs/contract.md section 5's precedence applied to the last segment's SDK facts (no routing, 1800 s later)."""
    seg = fact["segments"][-1]
    cause = _expected_cause(seg)
    if cause in ("error", "tool_error") or "error" in seg["last_statuses"]:
        return "FAILED"
    if cause == "approval_required":
        return "WAITING_UNROUTED"
    if cause == "timeout":
        return "STUCK"
    if cause == "unknown":
        return "UNCERTAIN"
    if cause == "aborted":
        return "BOUNDED_STOP"
    if cause == "stop_condition" and any(fact["roles"].get(cid) == "bound" for cid in seg["fired_at_last"]):
        return "BOUNDED_STOP"
    return "VERIFIED_COMPLETE" if fact["receipt"] else "FALSE_COMPLETE"


@pytest.mark.parametrize("seed", [1, 7])
def test_whole_runs_end_where_the_sdk_ended_them(seed: int, tmp_path) -> None:
    """Thousands of generated multi-step runs on the real SDK through the emitter and replay: each
    segment's step events stop where the SDK stopped, the reported cause and fired ids are what the
    SDK did, the evaluator derives the same, and the final state is the precedence's."""
    from collections import Counter

    from loopwarden.codecs import decode_input
    from loopwarden.replay import Replay

    node = _node()
    _built(node)
    proc = subprocess.run([node, "test/oracle/runs-oracle.mjs", "--seed", str(seed), "--runs", str(RUNS),
                           "--out", str(tmp_path)], cwd=EMITTER, capture_output=True, text=True, timeout=900,
                          env={**os.environ, "NODE_NO_WARNINGS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    facts = [json.loads(line) for line in (tmp_path / "facts.jsonl").read_text().splitlines()]
    assert len(facts) == RUNS
    events = [decode_input(line) for line in (tmp_path / "events.jsonl").read_bytes().splitlines()]
    replay = Replay(keep_final=True)
    for e in events:
        replay.feed(e)
    replay.finish(1800)

    steps_of: Counter = Counter()
    ended_of: dict = {}
    for e in events:
        kind = e.__struct_config__.tag
        if kind == "step_finished":
            steps_of[e.run_id, e.segment] += 1
        elif kind == "run_ended":
            ended_of[e.run_id, e.segment] = e
    problems = []
    endings, causes, states, kinds = Counter(), Counter(), Counter(), Counter()
    steps_total = 0
    for fact in facts:
        run_id = fact["run_id"]
        endings[fact["ending"]] += 1
        kinds.update(fact["kinds"])
        for i, seg in enumerate(fact["segments"]):
            steps_total += seg["steps"]
            cause = _expected_cause(seg)
            causes[cause] += 1
            if steps_of[run_id, i] != seg["steps"]:
                problems.append((run_id, i, "stop point", steps_of[run_id, i], seg["steps"]))
            end = ended_of.get((run_id, i))
            if end is None or end.cause != cause or end.step_count != seg["steps"]:
                problems.append((run_id, i, "reported cause", end and (end.cause, end.step_count), (cause, seg["steps"])))
            elif cause == "stop_condition" and sorted(end.fired) != seg["fired_at_last"]:
                problems.append((run_id, i, "fired", end.fired, seg["fired_at_last"]))
        final = replay.final[run_id]
        want = _expected_state(fact)
        states[want] += 1
        disagreements = list(final.evidence.disagreements)
        allowed = ["cause_not_recorded"] if want == "UNCERTAIN" else []
        if final.to_state != want or disagreements != allowed:
            problems.append((run_id, "final", (final.to_state, final.reason, disagreements), want, fact))
    assert not problems, f"{len(problems)} of {RUNS} runs differ, first: {problems[:3]}"
    # the generator reaches every condition kind and every way a run ends
    assert {"step_count", "tool_call", "loop_finished", "token_budget", "custom", "default_cap"} <= set(kinds)
    assert set(endings) == {"plain", "stream", "abort", "timeout", "error"}
    assert {"natural_finish", "stop_condition", "unexecuted_tool", "tool_error", "approval_required",
            "aborted", "timeout", "error"} <= set(causes)
    assert sum(len(f["segments"]) > 1 for f in facts) > 0 and sum(f["steered"] for f in facts) >= 0
    print(f"run oracle seed {seed}: {RUNS} runs, {sum(len(f['segments']) for f in facts)} segments, {steps_total} steps, "
          f"0 disagreements; endings {dict(endings)}; causes {dict(causes)}; final states {dict(states)}; "
          f"condition kinds {dict(kinds)}; steered runs {sum(f['steered'] for f in facts)}")
