"""Bounded recovery end to end (docs/recovery.md): real AI SDK agents through the emitter, the local broker, a
`loopwarden worker` on the wall clock, and the agents' own onAction handlers starting the next attempts.

One worker and one fleet for every scenario (agents and jobs of their own): the fleet's side is
`emitters/ai-sdk/test/e2e/recovery.mjs`, a lossy run included (its sink down while it runs); UNCERTAIN runs
come from the Python publisher, as a fleet in another language would send them (the emitter reports what
happened too faithfully to end UNCERTAIN otherwise). At the end the worker's actions are compared with
`loopwarden replay --actions` over the same topics' events."""

from __future__ import annotations

import heapq
import json
import os
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest

from loopwarden.codecs.events import OutcomeReceipt
from loopwarden.codecs.wire import encode
from loopwarden.trust import SigningKey
from tests.builders import ended, started, step
from tests.e2e.test_ai_sdk_agents import EMITTER, _built, _node
from tests.integration.harness import make_worker, publish, read_all, read_topic, run, stop_process, unique_config
from tests.recovery_kafka import differences

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

FLEET = EMITTER / "test" / "e2e" / "recovery.mjs"
KEY = SigningKey.generate("verifier-e2e")
# Actions the fleet and the Python runs cause, all told (see each test): 1 + 3 + 2 + 2 (one UNCERTAIN, one lossy).
ACTIONS = 8
QUIET_S = 5.0  # after the last action: long enough for a fourth attempt to start and go STUCK (2 s)


@dataclass
class Fleet:
    tag: str
    actions: list[dict]  # agent.actions, read_committed
    health: list[dict]  # agent.health
    handled: list[dict]  # what the fleet's onAction handlers carried out
    replayed: list[dict]  # `loopwarden replay --actions` over agent.steps and agent.outcomes, per partition
    seconds: float

    def of_job(self, job: str) -> list[dict]:
        return [a for a in self.actions if a["job_id"] == job]

    def runs_of_job(self, job: str) -> list[str]:
        """The job's attempts (their run ids) in order, from their transitions."""
        runs = {t["run_id"]: t["evidence"].get("attempt", 1) for t in self.health
                if t["run_id"] == job or t["evidence"].get("job_id") == job}
        return sorted(runs, key=runs.get)

    def states(self, run_id: str) -> list[tuple[str, str]]:
        return [(t["to_state"], t["reason"]) for t in sorted(self.health, key=lambda t: t["seq"]) if t["run_id"] == run_id]


def _python_runs(tag: str, now: int) -> list[dict]:
    """Runs of agent `ledger` whose verdicts a recovery policy may not act on (docs/recovery.md, safety rules)."""
    no_uncertain = {"max_attempts": 3, "on": {"STUCK": "resume", "BOUNDED_STOP": "restart"}}
    tells = {"max_attempts": 3, "on": {"STUCK": "resume", "UNCERTAIN": "escalate"}}

    def start(run: str, recovery: dict) -> dict:
        return started(run=run, ts=now, agent="ledger", stop_when=[{"kind": "step_count", "count": 5}],
                       inactivity_timeout_s=2, recovery=recovery)

    def lost(run: str, count: int, ts: int) -> dict:
        return {"type": "events_dropped", "run_id": run, "ts": ts, "count": count}

    events = []
    for run, recovery in ((f"unc-{tag}", no_uncertain), (f"unc-esc-{tag}", tells)):
        # reports three steps, one arrived: UNCERTAIN (step_count_mismatch)
        events += [start(run, recovery), step(0, run=run, ts=now + 10),
                   ended("natural_finish", 3, run=run, ts=now + 20)]
    run = f"lost-{tag}"  # lost events, then silence: UNCERTAIN (producer_dropped), never STUCK
    events += [start(run, no_uncertain | {"on": {"STUCK": "resume"}}), step(0, ("lookup", "result"), run=run, ts=now + 10),
               lost(run, 2, now + 20)]
    return events


def _replay(steps: list, outcomes: list, advance_s: float, tmp: Path) -> list[dict]:
    """The actions `loopwarden replay --actions` decides over these records, one replay per partition.

    A run's events share a partition, and the worker places each event on its partition's event clock (an event
    stamped before one already applied there counts from that clock: docs/contract.md section 5). So each
    partition is replayed on its own, its steps and outcomes in offset order merged by ts as the worker merges
    them: what the worker read, in the order it read it."""
    actions = []
    for p in sorted({r.partition for r in steps + outcomes}):
        def part(records: list) -> list[dict]:
            return [json.loads(r.value) for r in sorted((r for r in records if r.partition == p), key=lambda r: r.offset)]

        events = tmp / f"events-{p}.jsonl"
        merged = heapq.merge(part(steps), part(outcomes), key=lambda e: e["ts"])
        events.write_text("".join(json.dumps(e) + "\n" for e in merged))
        proc = subprocess.run(
            [sys.executable, "-m", "loopwarden.cli", "replay", str(events), "--actions", "--advance-s", f"{advance_s:.3f}",
             "--trusted-verifiers", KEY.setting],
            capture_output=True, text=True, timeout=120,
            env={k: v for k, v in os.environ.items() if not k.startswith("LOOPWARDEN_")})
        assert proc.returncode == 0, proc.stderr[-2000:]
        actions += [line for line in map(json.loads, proc.stdout.splitlines()) if line["type"] == "recovery_action"]
    return actions


class _Lines(threading.Thread):
    """The fleet's stdout, one JSON object a line, as it comes."""

    def __init__(self, stream) -> None:
        super().__init__(daemon=True)
        self.stream, self.lines = stream, []

    def run(self) -> None:
        for line in self.stream:
            self.lines.append(json.loads(line))


def _wait(what: str, check, timeout_s: float, log=lambda: "") -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"{what} not seen in {timeout_s}s\n{log()}"
        time.sleep(0.2)


@pytest.fixture(scope="module")
def fleet(kafka, tmp_path_factory: pytest.TempPathFactory) -> Fleet:
    """Runs every scenario once on one broker, one worker and one fleet; what they published afterwards."""
    node = _node()
    _built(node)
    tmp = tmp_path_factory.mktemp("recovery-e2e")
    tag = uuid.uuid4().hex[:6]
    config = unique_config(kafka.bootstrap, partitions=4)
    worker = make_worker(config, tmp, clock="wall", tick_interval_s=0.2)
    worker.extra_env = {"LOOPWARDEN_TRUSTED_VERIFIERS": KEY.setting}
    began = time.monotonic()
    worker.start()
    config = worker.config
    stderr = open(tmp / "fleet.stderr", "w")
    proc = subprocess.Popen(
        [node, str(FLEET), "--kafka", kafka.bootstrap, "--steps-topic", config.steps_topic,
         "--actions-topic", config.actions_topic, "--tag", tag],
        cwd=EMITTER, stdout=subprocess.PIPE, stderr=stderr, text=True, env={**os.environ, "NODE_NO_WARNINGS": "1"})
    lines = _Lines(proc.stdout)
    lines.start()

    def log() -> str:
        return f"fleet: {lines.lines}\n{(tmp / 'fleet.stderr').read_text()[-2000:]}\nworker:\n{worker.log_tail()}"

    def health() -> list[dict]:
        return [json.loads(r.value) for r in run(read_topic(config, config.health_topic, lambda rs: False, timeout_s=1))]

    try:
        _wait("the fleet", lambda: {"ready": True} in lines.lines, 60, log)
        now = int(time.time() * 1000)
        run(publish(config, [("steps", e["run_id"].encode(), json.dumps(e).encode()) for e in _python_runs(tag, now)]))
        # attempt 2 of the invoice job finished: the destination confirms it, signed by a trusted verifier
        second = f"inv-{tag}-a2"
        _wait(f"{second} VERIFYING", lambda: any(t["run_id"] == second and t["to_state"] == "VERIFYING" for t in health()),
              60, log)
        receipt = KEY.sign(OutcomeReceipt(run_id=second, ts=int(time.time() * 1000), receipt_id=f"{second}/invoice",
                                          kind="record", verifier="destination", verified=True))
        run(publish(config, [("outcomes", second.encode(), encode(receipt))]))
        got = run(read_topic(config, config.actions_topic, lambda rs: len(rs) >= ACTIONS, timeout_s=60))
        assert len(got) >= ACTIONS, f"{len(got)} of {ACTIONS} actions: {[r.value for r in got]}\n{log()}"
        time.sleep(QUIET_S)  # nothing more may come
        actions = [json.loads(r.value) for r in run(read_all(config, config.actions_topic))]
        transitions = [json.loads(r.value) for r in run(read_all(config, config.health_topic))]
        steps = run(read_all(config, config.steps_topic))
        outcomes = run(read_all(config, config.outcomes_topic))
        end_ms = int(time.time() * 1000)
    finally:
        stop_process(proc, timeout_s=10)
        worker.stop()
        stderr.close()
    lines.join(5)
    seconds = time.monotonic() - began
    last = max(json.loads(r.value)["ts"] for r in steps + outcomes)
    replayed = _replay(steps, outcomes, (end_ms - last) / 1000, tmp)
    out = Fleet(tag, actions, transitions, [h for h in lines.lines if "action_id" in h], replayed, seconds)
    jobs = {j: len(out.runs_of_job(f"{j}-{tag}")) for j in ("inv", "hang", "pay", "rates", "lossy")}
    print(f"\nRECOVERY-E2E-FIGURES seconds={seconds:.1f} attempts={jobs} actions={len(actions)} "
          f"by_action={dict(Counter(a['action'] for a in actions))} replayed={len(replayed)}")
    return out


def test_a_hung_first_attempt_is_resumed_once_and_its_second_attempt_verifies(fleet: Fleet) -> None:
    """STUCK in a tool → one resume → the handler's attempt 2 finishes and is verified; its evidence names the job, attempt 2."""
    job = f"inv-{fleet.tag}"
    [resume] = fleet.of_job(job)
    assert (resume["action"], resume["agent"], resume["attempt"], resume["next_attempt"]) == ("resume", "invoices", 1, 2)
    assert resume["reason"] == "STUCK:no_progress"
    assert fleet.states(job)[-1] == ("STUCK", "no_progress")
    assert [h["started"] for h in fleet.handled if h["action_id"] == resume["action_id"]] == [f"{job}-a2"]
    second = [t for t in fleet.health if t["run_id"] == f"{job}-a2"]
    assert fleet.states(f"{job}-a2")[-1] == ("VERIFIED_COMPLETE", "receipt")
    assert {(t["evidence"]["job_id"], t["evidence"]["attempt"]) for t in second} == {(job, 2)}


def test_an_agent_that_always_hangs_gets_max_attempts_then_one_escalation_and_nothing_more(fleet: Fleet) -> None:
    """max_attempts 3: attempts 1 and 2 are resumed, attempt 3 escalates (attempts_exhausted), and no attempt 4 starts."""
    job = f"hang-{fleet.tag}"
    assert fleet.runs_of_job(job) == [job, f"{job}-a2", f"{job}-a3"]
    assert all(fleet.states(r)[-1] == ("STUCK", "no_progress") for r in fleet.runs_of_job(job))
    actions = sorted(fleet.of_job(job), key=lambda a: a["attempt"])
    assert [(a["action"], a["attempt"], a["next_attempt"], a["reason"]) for a in actions] == [
        ("resume", 1, 2, "STUCK:no_progress"), ("resume", 2, 3, "STUCK:no_progress"),
        ("escalate", 3, None, "attempts_exhausted")]


def test_failed_on_a_non_idempotent_tool_escalates_and_on_an_idempotent_one_restarts(fleet: Fleet) -> None:
    """charge_card failed: one escalate (FAILED:not_idempotent), no attempt 2; fetch_rates failed: one restart, attempt 2 runs."""
    pay, rates = f"pay-{fleet.tag}", f"rates-{fleet.tag}"
    assert [(a["action"], a["reason"]) for a in fleet.of_job(pay)] == [("escalate", "FAILED:not_idempotent")]
    assert fleet.runs_of_job(pay) == [pay]
    assert [(a["action"], a["reason"], a["next_attempt"]) for a in fleet.of_job(rates)] == [
        ("restart", "FAILED:tool_error", 2)]
    assert fleet.runs_of_job(rates) == [rates, f"{rates}-a2"]
    assert fleet.states(f"{rates}-a2")[-1] == ("VERIFYING", "natural_finish")


def test_uncertain_and_lossy_runs_get_no_new_attempt_only_the_escalations_their_policies_name(fleet: Fleet) -> None:
    """UNCERTAIN: no new attempt, only an escalate its policy names; a run that lost events is UNCERTAIN (never STUCK
    nor FAILED), likewise."""
    tag = fleet.tag
    assert fleet.of_job(f"unc-{tag}") == [] and fleet.states(f"unc-{tag}")[-1] == ("UNCERTAIN", "step_count_mismatch")
    assert [(a["action"], a["reason"]) for a in fleet.of_job(f"unc-esc-{tag}")] == [
        ("escalate", "UNCERTAIN:step_count_mismatch")]
    assert fleet.of_job(f"lost-{tag}") == []
    assert fleet.states(f"lost-{tag}")[-1] == ("UNCERTAIN", "producer_dropped")
    assert "STUCK" not in {s for s, _ in fleet.states(f"lost-{tag}")}
    # the emitter's lossy run: its last step failed on an idempotent tool, but the run lost events: no restart
    lossy = f"lossy-{tag}"
    assert fleet.states(lossy)[-1] == ("UNCERTAIN", "producer_dropped")
    assert "FAILED" not in {s for s, _ in fleet.states(lossy)}
    assert [(a["action"], a["reason"]) for a in fleet.of_job(lossy)] == [("escalate", "UNCERTAIN:producer_dropped")]
    assert fleet.runs_of_job(lossy) == [lossy]


def test_every_action_is_published_once_and_equals_replays(fleet: Fleet) -> None:
    """agent.actions holds each action_id once, the fleet handled each once, and they are replay's actions, times included."""
    assert len(fleet.actions) == ACTIONS
    assert not [k for k, n in Counter(a["action_id"] for a in fleet.actions).items() if n > 1]
    assert sorted(h["action_id"] for h in fleet.handled) == sorted(
        a["action_id"] for a in fleet.actions if a["agent"] != "ledger")
    assert not differences(fleet.actions, {a["action_id"]: a for a in fleet.replayed})
