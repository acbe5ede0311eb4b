"""Terse builders for input events as plain dicts (the wire shape), for table-driven tests."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

DONE_POLICY = [{"kind": "step_count", "count": 20}, {"kind": "tool_call", "tools": ["done"]}]


def started(run: str = "r", ts: int = 0, stop_when: Any = DONE_POLICY, agent: str = "agent", **policy: Any) -> dict:
    return {"type": "run_started", "run_id": run, "ts": ts, "agent": agent,
            "policy": {"version": "v1", "stop_when": stop_when, **policy}}


def step(n: int, *calls: tuple[str, ...], run: str = "r", ts: int = 0, seg: int = 0,
         finish: str | None = None, tokens: int | None = None) -> dict:
    """A step; ``calls`` are (name, status) or (name, status, "provider"); finish defaults to tool-calls, or stop without calls."""
    usage = {"total_tokens": tokens} if tokens is not None else {"input_tokens": 10, "output_tokens": 5}
    return {"type": "step_finished", "run_id": run, "ts": ts, "segment": seg, "step": n,
            "finish_reason": finish or ("tool-calls" if calls else "stop"),
            "tool_calls": [{"id": f"{run}-{seg}-{n}-{i}", "name": c[0], "status": c[1],
                            **({"provider_executed": True} if c[2:] == ("provider",) else {})}
                           for i, c in enumerate(calls)],
            "usage": usage}


def ended(cause: str, steps: int, *fired: str, run: str = "r", ts: int = 0, seg: int = 0,
          approval: dict | None = None, error_name: str | None = None, steered: bool | None = None) -> dict:
    out = {"type": "run_ended", "run_id": run, "ts": ts, "segment": seg, "cause": cause,
           "fired": list(fired), "step_count": steps, "approval": approval, "error_name": error_name}
    if steered is not None:
        out["steered"] = steered
    return out


def approval(aid: str = "ap1", routed: bool = True, deadline_ts: int = 10_000_000) -> dict:
    return {"approval_id": aid, "tool_call_id": "tc", "tool_name": "pay",
            "owner": "oncall" if routed else None, "deadline_ts": deadline_ts if routed else None,
            "resume_token": "tok" if routed else None}


def routed(aid: str = "ap1", run: str = "r", ts: int = 0, deadline_ts: int = 10_000_000) -> dict:
    return {"type": "approval_routed", "run_id": run, "ts": ts, "approval_id": aid,
            "owner": "oncall", "deadline_ts": deadline_ts, "resume_token": "tok"}


def resolved(aid: str = "ap1", approved: bool = True, run: str = "r", ts: int = 0) -> dict:
    return {"type": "approval_resolved", "run_id": run, "ts": ts, "approval_id": aid, "approved": approved}


def receipt(rid: str, kind: str = "file", verified: bool = True, run: str = "r", ts: int = 0,
            run_started_ts: int | None = None) -> dict:
    """``run_started_ts``: the occurrence the receipt names (absent: its ``ts`` stands in)."""
    out = {"type": "outcome_receipt", "run_id": run, "ts": ts, "receipt_id": rid, "kind": kind,
           "verifier": "destination", "verified": verified, "evidence": {"sha256": "ab" * 32, "size": 10}}
    return out if run_started_ts is None else {**out, "run_started_ts": run_started_ts}


def timed(*events: dict, start: int = 1_000_000, gap_ms: int = 1000) -> list[dict]:
    """Give events increasing ts (gap_ms apart) unless they already carry a non-zero ts."""
    out = []
    for i, e in enumerate(events):
        out.append({**e, "ts": e["ts"] or start + i * gap_ms})
    return out


def steps(count: int, name: str = "lookup", seg: int = 0, run: str = "r", **kw: Any) -> list[dict]:
    return [step(i, (name, "result"), seg=seg, run=run, **kw) for i in range(count)]


def segment_started(seg: int, stop_when: Any = None, run: str = "r", ts: int = 0, policy: bool = True) -> dict:
    """A segment_started; ``policy=False`` sends a null policy (the segment runs under the run's)."""
    return {"type": "segment_started", "run_id": run, "ts": ts, "segment": seg,
            "policy": {"version": "v1-resume", "stop_when": stop_when} if policy else None}


def active(seg: int = 0, where: str = "tool", run: str = "r", ts: int = 0, call: str | None = "tc") -> dict:
    return {"type": "run_active", "run_id": run, "ts": ts, "segment": seg, "in": where, "tool_call_id": call}


def dropped(count: int, run: str = "r", ts: int = 0) -> dict:
    return {"type": "events_dropped", "run_id": run, "ts": ts, "count": count}


@dataclass
class Rec:
    """A consumed record, as aiokafka's ConsumerRecord offers it to a partition's fold."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple = ()
