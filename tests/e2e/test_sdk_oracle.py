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
