"""A fleet of runs under recovery policies, for the tests that compare the worker's actions with replay's.

Every kind of run a policy answers: a tool that hangs (STUCK), failed idempotent and non-idempotent tools
(FAILED), a step cap (BOUNDED_STOP), a producer that lost events (UNCERTAIN), and runs that complete.
The agent ``invoice`` takes its policy from the processor's defaults (:data:`DEFAULTS`); the others
declare their own. Runs are attempts 1 or 2 of their job, so some escalate with ``attempts_exhausted``.
"""

from __future__ import annotations

import random

import msgspec

from tests.builders import dropped, ended, receipt, started, step

POLICY = {"max_attempts": 2, "backoff_s": 5, "idempotent_tools": ["fetch"], "escalate_to": "ops",
          "on": {"STUCK": "resume", "FAILED": "restart", "BOUNDED_STOP": "restart", "UNCERTAIN": "escalate"}}
DEFAULTS = {"invoice": POLICY}
KINDS = ("hang", "fail_fetch", "fail_charge", "bounded", "dropped", "done")


def recovery_fleet(runs: int, seed: int = 5, start_ms: int = 1_000_000) -> list[dict]:
    """The fleet's events, in ts order (each run's own events spaced 1 s; runs start 200 ms apart)."""
    rng = random.Random(seed)
    events: list[dict] = []
    for i in range(runs):
        kind = KINDS[i % len(KINDS)]
        agent = "invoice" if rng.random() < 0.5 else "support"
        attempt = rng.choice((1, 2))
        run = f"job{i}-a{attempt}"
        t0 = start_ms + 200 * i
        own = {} if agent == "invoice" else {"recovery": POLICY}
        cap = [{"kind": "step_count", "count": 1}] if kind == "bounded" else None
        first = started(run=run, ts=t0, agent=agent, inactivity_timeout_s=60, receipt_window_s=120,
                        **({"stop_when": cap} if cap else {}), **own)
        first.update(job_id=f"job{i}", attempt=attempt, **({"recovers": f"job{i}-a1"} if attempt == 2 else {}))
        mine = [first]
        if kind == "hang":
            mine.append(step(0, ("lookup", "result"), run=run))
        elif kind in ("fail_fetch", "fail_charge"):
            mine += [step(0, ("fetch" if kind == "fail_fetch" else "charge_card", "error"), run=run),
                     ended("tool_error", 1, run=run)]
        elif kind == "bounded":
            mine += [step(0, ("lookup", "result"), run=run), ended("stop_condition", 1, "step_count:1", run=run)]
        elif kind == "dropped":
            mine += [step(0, ("lookup", "result"), run=run), dropped(2, run=run), ended("natural_finish", 2, run=run)]
        else:
            mine += [step(0, ("lookup", "result"), run=run), step(1, run=run), ended("natural_finish", 2, run=run),
                     receipt(f"rc-{run}", run=run)]
        for n, e in enumerate(mine):
            e["ts"] = t0 + 1000 * n
        events += mine
    events.sort(key=lambda e: e["ts"])
    return events


def encoded(events: list[dict]) -> list[bytes]:
    return [msgspec.json.encode(e) for e in events]
