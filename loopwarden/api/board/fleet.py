"""The runs board's view of the fleet: every run's last transitions, folded from ``agent.health``, bounded.

Pure (no I/O, no clock: ``now_ms`` is an argument), so it is tested without Kafka or a
browser. :meth:`Fleet.add` takes one transition as read (the JSON bytes, decoded with
the contract's codec); repeats of a ``(run_id, seq)`` already seen are ignored.

Memory is bounded: a **settled** run (VERIFIED_COMPLETE, BOUNDED_STOP: nothing for a
person to do) leaves the board ``settled_ms`` after it settled; beyond ``max_runs``
the longest-settled run goes first, else the run quiet the longest. Each run keeps its
last ``HISTORY`` transitions as the bytes read (evidence included; no run content:
transitions carry none). Counts by state and agent are kept for the runs held; the
last hour's transitions are counted in per-minute buckets (at most 60 of them).
"""

from __future__ import annotations

from collections import Counter, OrderedDict

import msgspec
from sortedcontainers import SortedList

from loopwarden.codecs import STATES, HealthTransition, InvalidEvent, decode_transition
from loopwarden.codecs.states import NEEDS_PERSON, SETTLED, STATE_TABLE

ATTENTION = NEEDS_PERSON  # the runs listed first: nothing happens until a person acts (SETTLED: nothing to do)
HISTORY = 32  # transitions kept per run (the worker's read API keeps as many)
HOUR_MS = 3_600_000
MINUTE_MS = 60_000
AGENTS_MAX = 1000  # agent names counted one by one; later ones as "other"
NO_AGENT = "(none)"

# What an operator does about each state: one line, beside the link to docs/states.md#<state>.
ACTIONS = {s.name: f"{s.do[0].upper()}{s.do[1:]}: {s.meaning}." for s in STATE_TABLE}


class Run(msgspec.Struct, gc=False):
    """A run on the board: its last transition's summary and the transitions themselves (as read)."""

    run_id: str
    state: str
    since_ts: int
    reason: str
    agent: str | None
    seq: int
    updated_ms: int  # now_ms of the last add (for aging)
    raw: list[bytes]  # the last HISTORY transitions, oldest first


def summary(run: Run, now_ms: int) -> dict:
    return {"run_id": run.run_id, "state": run.state, "agent": run.agent, "seq": run.seq, "reason": run.reason,
            "since_ts": run.since_ts, "in_state_s": max(0, now_ms - run.since_ts) // 1000}


class Fleet:
    """Runs of the whole fleet (all partitions of agent.health), with counts now and over the last hour."""

    def __init__(self, *, settled_ms: int = HOUR_MS, max_runs: int = 100_000) -> None:
        self.settled_ms = settled_ms
        self.max_runs = max_runs
        self.runs: dict[str, Run] = {}
        self._settled: OrderedDict[str, int] = OrderedDict()  # run id -> when it settled (now_ms), oldest first
        self._active: OrderedDict[str, None] = OrderedDict()  # the others, least recently updated first
        self._attention = SortedList()  # (since_ts, run_id) of runs in an ATTENTION state: oldest first
        self._attention_by: dict[tuple[str, str], SortedList] = {}  # ("state"|"agent", name) -> the same, filtered
        self.by_state: Counter = Counter()
        self.by_agent: dict[str, Counter] = {}  # agent -> state -> runs held
        self._minutes: dict[int, Counter] = {}  # minute (ts // 60 s) -> Counter((agent, to_state)), last hour
        self.version = 0  # +1 per change: the stream sends a snapshot when it moved
        self.ignored = Counter()  # why transitions were not taken: repeat, undecodable

    # -- folding ------------------------------------------------------------------------
    def add(self, raw: bytes, now_ms: int) -> Run | None:
        """Fold one transition (JSON bytes from agent.health); the run, or None if ignored."""
        try:
            t: HealthTransition = decode_transition(raw)
        except (InvalidEvent, ValueError):
            self.ignored["undecodable"] += 1
            return None
        run = self.runs.get(t.run_id)
        if run is not None and t.seq <= run.seq:
            self.ignored["repeat"] += 1  # an uncommitted read's repeat, or a restart's re-read
            return None
        agent = t.agent
        if run is None:
            run = self.runs[t.run_id] = Run(t.run_id, t.to_state, t.ts, t.reason, agent, t.seq, now_ms, [raw])
        else:
            self._uncount(run)
            run.state, run.since_ts, run.reason, run.seq, run.updated_ms = t.to_state, t.ts, t.reason, t.seq, now_ms
            run.agent = agent if agent is not None else run.agent
            run.raw.append(raw)
            if len(run.raw) > HISTORY:
                del run.raw[:-HISTORY]
        self._count(run, now_ms)
        minute = t.ts // MINUTE_MS
        if minute > now_ms // MINUTE_MS - 60:  # in the last hour
            self._minutes.setdefault(minute, Counter())[self._agent_key(run.agent), t.to_state] += 1
        self.expire(now_ms)
        self.version += 1
        return run

    def _agent_key(self, agent: str | None) -> str:
        if agent is None:
            return NO_AGENT
        return agent if agent in self.by_agent or len(self.by_agent) < AGENTS_MAX else "other"

    def _count(self, run: Run, now_ms: int) -> None:
        self.by_state[run.state] += 1
        self.by_agent.setdefault(self._agent_key(run.agent), Counter())[run.state] += 1
        if run.state in SETTLED:
            self._active.pop(run.run_id, None)
            self._settled[run.run_id] = now_ms
            self._settled.move_to_end(run.run_id)
        else:
            self._settled.pop(run.run_id, None)
            self._active[run.run_id] = None
            self._active.move_to_end(run.run_id)
        if run.state in ATTENTION:
            key = (run.since_ts, run.run_id)
            self._attention.add(key)
            for by in (("state", run.state), ("agent", run.agent or NO_AGENT)):
                self._attention_by.setdefault(by, SortedList()).add(key)

    def _uncount(self, run: Run) -> None:
        self.by_state[run.state] -= 1
        counts = self.by_agent.get(self._agent_key(run.agent))
        if counts is not None:
            counts[run.state] -= 1
        if run.state in ATTENTION:
            key = (run.since_ts, run.run_id)
            self._attention.discard(key)
            for by in (("state", run.state), ("agent", run.agent or NO_AGENT)):
                listed = self._attention_by.get(by)
                if listed is not None:
                    listed.discard(key)
                    if not listed:
                        del self._attention_by[by]

    def _drop(self, run_id: str) -> None:
        run = self.runs.pop(run_id)
        self._uncount(run)
        self._settled.pop(run_id, None)
        self._active.pop(run_id, None)

    def expire(self, now_ms: int) -> int:
        """Drop settled runs older than settled_ms, then the oldest beyond max_runs; the number dropped."""
        n = 0
        while self._settled and next(iter(self._settled.values())) <= now_ms - self.settled_ms:
            self._drop(next(iter(self._settled)))
            n += 1
        while len(self.runs) > self.max_runs:
            self._drop(next(iter(self._settled or self._active)))
            n += 1
        horizon = now_ms // MINUTE_MS - 60
        for minute in [m for m in self._minutes if m <= horizon]:
            del self._minutes[minute]
        if n:
            self.version += 1
        return n

    # -- reading ------------------------------------------------------------------------
    def hour(self, now_ms: int) -> tuple[Counter, dict[str, Counter]]:
        """Transitions into each state over the last hour: by state, and by agent then state."""
        horizon = now_ms // MINUTE_MS - 60
        by_state: Counter = Counter()
        by_agent: dict[str, Counter] = {}
        for minute, counts in self._minutes.items():
            if minute <= horizon:
                continue
            for (agent, state), n in counts.items():
                by_state[state] += n
                by_agent.setdefault(agent, Counter())[state] += n
        return by_state, by_agent

    def attention(self, *, state: str | None = None, agent: str | None = None, limit: int = 200) -> list[Run]:
        """Runs that need a person (ATTENTION states), oldest in their state first, filtered: walks the
        smaller of the state's and the agent's lists, never every run."""
        lists = [self._attention_by.get(by, ()) for by in (("state", state), ("agent", agent)) if by[1] is not None]
        walk = min(lists, key=len) if lists else self._attention
        out = []
        for _since, run_id in walk:
            run = self.runs[run_id]
            if (state is None or run.state == state) and (agent is None or (run.agent or NO_AGENT) == agent):
                out.append(run)
                if len(out) >= limit:
                    break
        return out

    def snapshot(self, now_ms: int, *, state: str | None = None, agent: str | None = None,
                 limit: int = 200) -> dict:
        """What the board shows: counts now and over the last hour, and the runs that need a person."""
        hour_state, hour_agent = self.hour(now_ms)
        agents = sorted(set(self.by_agent) | set(hour_agent))
        return {
            "now_ts": now_ms,
            "version": self.version,
            "runs": len(self.runs),
            "states": list(STATES),
            "attention_states": list(ATTENTION),
            "by_state": {s: self.by_state.get(s, 0) for s in STATES},
            "hour_by_state": {s: hour_state.get(s, 0) for s in STATES},
            "by_agent": [{"agent": a, "now": {s: n for s, n in self.by_agent.get(a, {}).items() if n},
                          "hour": dict(hour_agent.get(a, {}))} for a in agents
                         if any(self.by_agent.get(a, {}).values()) or a in hour_agent],
            "attention": [summary(r, now_ms) for r in self.attention(state=state, agent=agent, limit=limit)],
            "attention_total": len(self._attention),
        }

    def run_document(self, run_id: str, now_ms: int) -> dict | None:
        """One run's page: its state now, what to do about it, and every transition kept with its evidence."""
        run = self.runs.get(run_id)
        if run is None:
            return None
        transitions = []
        for raw in run.raw:
            t = msgspec.json.decode(raw)
            transitions.append({k: t.get(k) for k in ("seq", "ts", "emitted_ts", "from_state", "to_state", "reason",
                                                       "policy_version", "evidence")})
        return {**summary(run, now_ms), "action": ACTIONS.get(run.state, ""), "transitions": transitions}
