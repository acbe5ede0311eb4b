"""A realistic, seeded, mixed fleet of agent runs as events, covering every health state.

Pure: :func:`fleet` returns the messages (topic role, key, bytes) in ts order. The
``simulate`` command publishes them to Kafka (live, paced by their ts, or as fast
as possible) or writes them as JSON lines for ``loopwarden replay``.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from loopwarden.codecs import (
    Approval,
    ApprovalResolved,
    ApprovalRouted,
    Condition,
    Custom,
    OutcomeExpected,
    OutcomeReceipt,
    Policy,
    RunEnded,
    RunStarted,
    StepCount,
    StepFinished,
    TokenBudget,
    ToolCall,
    ToolCallCondition,
    Usage,
    encode,
)


@dataclass(frozen=True)
class Message:
    ts: int
    topic: str  # "steps" | "outcomes"
    key: bytes | None
    value: bytes
    valid: bool = True


# scenario name -> weight; every health state is reachable from these
SCENARIOS = {
    "natural_verified": 14,
    "natural_unverified": 6,
    "done_tool_verified": 10,
    "done_execute_negative": 4,
    "late_receipt": 3,
    "receipt_first": 3,
    "step_cap": 6,
    "token_budget": 4,
    "aborted": 4,
    "tool_error": 5,
    "error": 2,
    "approval_routed": 4,
    "approval_resumed": 5,
    "approval_expired": 2,
    "approval_unrouted": 3,
    "approval_routed_later": 2,
    "timeout": 3,
    "hung": 3,
    "overrun": 2,
    "step_count_mismatch": 2,
    "no_run_started": 3,
    "duplicates": 4,
}
AGENTS = ("invoice-agent", "triage-agent", "deploy-agent", "report-agent")
KINDS = {"invoice-agent": "record", "triage-agent": "message", "deploy-agent": "deployment", "report-agent": "file"}


class _Run:
    """Builds one run's events with a moving clock."""

    def __init__(self, rng: random.Random, run_id: str, start_ms: int, policy: Policy, agent: str) -> None:
        self.rng, self.run_id, self.t, self.policy, self.agent = rng, run_id, start_ms, policy, agent
        self.out: list[Message] = []
        self.seg = 0

    def tick(self, lo: int = 200, hi: int = 1500) -> int:
        self.t += self.rng.randint(lo, hi)
        return self.t

    def emit(self, event, topic: str = "steps") -> None:
        self.out.append(Message(event.ts, topic, self.run_id.encode(), encode(event)))

    def started(self) -> None:
        self.emit(RunStarted(run_id=self.run_id, ts=self.tick(0, 50), agent=self.agent, policy=self.policy))

    def step(self, n: int, calls: tuple[tuple[str, str], ...] = (("lookup", "result"),), finish: str | None = None,
             tokens: int | None = None) -> StepFinished:
        ev = StepFinished(
            run_id=self.run_id, ts=self.tick(), segment=self.seg, step=n,
            finish_reason=finish or ("tool-calls" if calls else "stop"),
            tool_calls=tuple(ToolCall(id=f"{self.run_id}-{self.seg}-{n}-{i}", name=name, status=status)
                             for i, (name, status) in enumerate(calls)),
            usage=Usage(input_tokens=self.rng.randint(200, 900), output_tokens=self.rng.randint(20, 200),
                        total_tokens=tokens),
        )
        self.emit(ev)
        return ev

    def work(self, n: int) -> int:
        for i in range(n):
            self.step(i)
        return n

    def ended(self, cause: str, steps: int, fired: tuple[str, ...] = (), approval: Approval | None = None,
              error_name: str | None = None) -> None:
        self.emit(RunEnded(run_id=self.run_id, ts=self.tick(50, 300), segment=self.seg, cause=cause, fired=fired,
                           step_count=steps, approval=approval, error_name=error_name))

    def receipt(self, verified: bool = True, delay_ms: tuple[int, int] = (500, 8000), kind: str | None = None) -> None:
        ts = self.t + self.rng.randint(*delay_ms)
        self.out.append(Message(ts, "outcomes", self.run_id.encode(), encode(OutcomeReceipt(
            run_id=self.run_id, ts=ts, receipt_id=f"rc-{self.run_id}-{len(self.out)}",
            kind=kind or KINDS[self.agent], verifier="destination", verified=verified,
            evidence={"sha256": f"{self.rng.getrandbits(256):064x}", "size": self.rng.randint(100, 10**6)}))))

    def approval(self, routed: bool, deadline_in_ms: int) -> Approval:
        return Approval(approval_id=f"ap-{self.run_id}-{self.seg}", tool_call_id=f"{self.run_id}-{self.seg}-x",
                        tool_name="pay_invoice", owner="finance-oncall" if routed else None,
                        deadline_ts=self.t + deadline_in_ms if routed else None,
                        resume_token=f"tok-{self.run_id}" if routed else None)


def _policy(rng: random.Random, kind: str, timers_s: tuple[float, float]) -> Policy:
    inactivity_s, window_s = timers_s
    conditions: tuple[Condition, ...] = (StepCount(count=8), ToolCallCondition(tools=("done",)))
    if kind == "token_budget":
        conditions = (StepCount(count=20), TokenBudget(max_tokens=3000))
    elif kind == "tool_error":
        conditions = (StepCount(count=20), Custom(name="stopOnToolError", role="bound"))
    return Policy(version=f"v{rng.randint(1, 3)}", stop_when=conditions,
                  inactivity_timeout_s=inactivity_s, receipt_window_s=window_s)


def _scenario(r: _Run, name: str, timers_s: tuple[float, float]) -> None:
    rng = r.rng
    inactivity_ms, window_ms = int(timers_s[0] * 1000), int(timers_s[1] * 1000)
    if name != "no_run_started":
        r.started()
    if name in ("natural_verified", "natural_unverified", "no_run_started", "duplicates", "receipt_first"):
        if name == "receipt_first":
            r.receipt(delay_ms=(10, 100))
        n = r.work(rng.randint(1, 5))
        if name == "duplicates":
            last = r.out[-1]
            r.out.append(Message(last.ts + 1, last.topic, last.key, last.value))  # redelivered step
        r.step(n, calls=())
        r.ended("natural_finish", n + 1)
        if name in ("natural_verified", "no_run_started", "duplicates"):
            r.receipt()
    elif name in ("done_tool_verified", "done_execute_negative", "late_receipt"):
        n = r.work(rng.randint(1, 5))
        if name == "done_execute_negative":
            r.step(n, calls=(("done", "result"),))
            r.ended("stop_condition", n + 1, fired=("tool_call:done",))
            r.receipt(verified=False)
        else:
            r.step(n, calls=(("done", "pending"),))
            r.ended("unexecuted_tool", n + 1)
            if name == "late_receipt":
                r.receipt(delay_ms=(window_ms + 2000, window_ms + 6000))
            else:
                r.receipt()
    elif name == "step_cap":
        r.work(8)
        r.ended("stop_condition", 8, fired=("step_count:8",))
    elif name == "token_budget":
        n = 0
        for n in range(5):
            r.step(n, tokens=1000)
            if (n + 1) * 1000 >= 3000:
                break
        r.ended("stop_condition", n + 1, fired=("token_budget:3000",))
    elif name == "aborted":
        n = r.work(rng.randint(1, 4))
        r.ended("aborted", n, error_name="AbortError")
    elif name == "tool_error":
        n = r.work(rng.randint(0, 3))
        r.step(n, calls=(("create_invoice", "error"),))
        r.ended("tool_error", n + 1, fired=("custom:stopOnToolError",))
    elif name == "error":
        n = r.work(rng.randint(1, 3))
        r.ended("error", n, error_name="APICallError")
    elif name.startswith("approval"):
        n = r.work(rng.randint(0, 3))
        r.step(n, calls=(("pay_invoice", "approval_requested"),))
        routed = name in ("approval_routed", "approval_resumed", "approval_expired")
        deadline = rng.randint(2, 4) * inactivity_ms if name == "approval_expired" else 100 * window_ms
        appr = r.approval(routed, deadline)
        r.ended("approval_required", n + 1, approval=appr)
        if name == "approval_routed_later":
            r.t += rng.randint(1000, 3000)
            r.emit(ApprovalRouted(run_id=r.run_id, ts=r.t, approval_id=appr.approval_id, owner="ops",
                                  deadline_ts=r.t + 100 * window_ms, resume_token="tok"))
        if name == "approval_resumed":
            r.t += rng.randint(1000, 5000)
            r.emit(ApprovalResolved(run_id=r.run_id, ts=r.t, approval_id=appr.approval_id, approved=rng.random() < 0.8))
            r.seg += 1
            m = r.work(rng.randint(0, 2))
            r.step(m, calls=())
            r.ended("natural_finish", m + 1)
            r.receipt()
    elif name == "timeout":
        n = r.work(rng.randint(1, 4))
        r.ended("timeout", n, error_name="TimeoutError")
    elif name == "hung":
        r.work(rng.randint(1, 3))  # then silence: inactivity makes it STUCK
    elif name == "overrun":
        r.work(9)  # 9 steps under isStepCount(8): the recorded policy is not the one that ran
        r.step(9, calls=())
        r.ended("natural_finish", 10)
    elif name == "step_count_mismatch":
        n = r.work(rng.randint(1, 3))
        r.step(n, calls=())
        r.ended("natural_finish", n + 3)
    else:  # pragma: no cover - SCENARIOS and this function go together
        raise ValueError(f"unknown scenario {name!r}")


BAD_MESSAGES = (
    (b"{not json", "steps"),
    (b'{"type":"step_started","run_id":"bad-1","ts":1}', "steps"),
    (b'{"type":"step_finished","run_id":"bad-2","ts":"yesterday","step":0,"finish_reason":"stop"}', "steps"),
    (b'{"type":"outcome_receipt","run_id":"bad-3","ts":1,"receipt_id":"r","kind":"pdf","verifier":"destination","verified":true}', "outcomes"),
    (b'{"type":"run_ended","run_id":"bad-4","ts":1,"cause":"approval_required","step_count":1,"approval":null,"error_name":null}', "steps"),
)


def fleet(
    runs: int,
    seed: int = 7,
    start_ms: int = 1_780_000_000_000,
    rate: float = 50.0,
    timers_s: tuple[float, float] = (300.0, 600.0),
    bad_every: int = 100,
) -> list[Message]:
    """The messages of ``runs`` runs starting ``1/rate`` s apart, sorted by ts.

    Runs cycle through :data:`SCENARIOS` (weighted, seeded); every ``bad_every``-th
    run is followed by an invalid message (0 disables them).
    """
    rng = random.Random(seed)
    names = list(SCENARIOS)
    weights = [SCENARIOS[n] for n in names]
    out: list[Message] = []
    for i in range(runs):
        # the first len(SCENARIOS) runs cover every scenario once; then weighted draws
        name = names[i] if i < len(names) else rng.choices(names, weights)[0]
        agent = AGENTS[i % len(AGENTS)]
        run = _Run(rng, f"run-{seed}-{i:06d}-{name}", start_ms + int(i * 1000 / rate),
                   _policy(rng, name, timers_s), agent)
        _scenario(run, name, timers_s)
        out += run.out
        if bad_every and i % bad_every == bad_every - 1:
            value, topic = BAD_MESSAGES[(i // bad_every) % len(BAD_MESSAGES)]
            out.append(Message(run.t, topic, f"bad-{i}".encode(), value, valid=False))
    out.sort(key=lambda m: m.ts)  # stable: a run's own events keep their order
    return out


def one_run(run_id: str, now_ms: int, expect_file: str | None = None) -> list[Message]:
    """One run that ends naturally after one step, stamped from ``now_ms``; with ``expect_file`` (an absolute
    path) it first declares that file as its outcome, for ``loopwarden verify`` to check (docs/first-receipt.md)."""
    ts = iter(range(now_ms, now_ms + 10))
    events: list = [RunStarted(run_id=run_id, ts=next(ts), agent="first-run", policy=Policy(version="v1"))]
    if expect_file is not None:
        events.append(OutcomeExpected(run_id=run_id, ts=next(ts), expectation_id=f"{run_id}-file", kind="file",
                                      target=f"file://{expect_file}", checks={"min_size": 1}))
    events += [StepFinished(run_id=run_id, ts=next(ts), step=0, finish_reason="stop"),
               RunEnded(run_id=run_id, ts=next(ts), cause="natural_finish", step_count=1, approval=None,
                        error_name=None)]
    return [Message(e.ts, "steps", run_id.encode(), encode(e)) for e in events]
