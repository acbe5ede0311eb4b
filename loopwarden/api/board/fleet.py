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

:meth:`Fleet.add_action` takes one ``recovery_action`` from ``agent.actions``: each run keeps the last
``HISTORY`` actions decided on it (who, why), and a job's attempts are linked from the transitions'
evidence (``job_id``, ``attempt``) and the actions. A person's ``abandon`` takes the run off the "needs
a person" list for good (the job is closed); an ``acknowledge`` does while the run stays in the state
it was acknowledged in (a later transition is something new to look at). Both are listed under
``closed``. The list is indexed by every combination of state, agent and reason, so any filter is one
ordered list: a page is a slice, never a walk over the fleet.
"""

from __future__ import annotations

from collections import Counter, OrderedDict

import msgspec
from sortedcontainers import SortedList

from loopwarden.codecs import STATES, HealthTransition, InvalidEvent, decode_transition
from loopwarden.codecs.events import RecoveryAction
from loopwarden.codecs.states import NEEDS_PERSON, SETTLED, STATE_TABLE

ATTENTION = NEEDS_PERSON  # the runs listed first: nothing happens until a person acts (SETTLED: nothing to do)
HISTORY = 32  # transitions kept per run (the worker's read API keeps as many)
HOUR_MS = 3_600_000
MINUTE_MS = 60_000
AGENTS_MAX = 1000  # agent names counted one by one; later ones as "other"
NO_AGENT = "(none)"
PAGE_MAX = 1000  # rows a page holds at most
GROUPS_MAX = 200  # groups (agent, state, reason) listed at most, the largest first
CLOSING = ("abandon", "acknowledge")  # a person's actions that take a run off the list
VIEWS = ("open", "closed")  # the list of runs that need a person, and of those a person closed
_decode_action = msgspec.json.Decoder(RecoveryAction).decode

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
    job_id: str | None = None  # from the evidence, when the run declared a job
    attempt: int | None = None
    started_ts: int | None = None  # its first transition's ts (the run_started's), when kept
    closed: dict | None = None  # the person's abandon or acknowledge that takes it off the list now


def action_summary(a: RecoveryAction) -> dict:
    return {"action_id": a.action_id, "action": a.action, "reason": a.reason, "decided_by": a.decided_by,
            "ts": a.ts, "not_before_ts": a.not_before_ts, "job_id": a.job_id, "attempt": a.attempt,
            "next_attempt": a.next_attempt, "override_bound": a.override_bound, "escalate_to": a.escalate_to}


def summary(run: Run, now_ms: int) -> dict:
    closed = run.closed
    return {"run_id": run.run_id, "state": run.state, "agent": run.agent, "seq": run.seq, "reason": run.reason,
            "since_ts": run.since_ts, "in_state_s": max(0, now_ms - run.since_ts) // 1000,
            "job_id": run.job_id, "attempt": run.attempt,
            "closed": None if closed is None else {k: closed[k] for k in ("action", "decided_by", "reason", "ts")}}


def _index_keys(view: str, state: str, agent: str, reason: str) -> list[tuple]:
    """Every list a run is in: each combination of its state, agent and reason (None: any)."""
    return [(view, s, a, r) for s in (None, state) for a in (None, agent) for r in (None, reason)]


class Fleet:
    """Runs of the whole fleet (all partitions of agent.health), with counts now and over the last hour."""

    def __init__(self, *, settled_ms: int = HOUR_MS, max_runs: int = 100_000) -> None:
        self.settled_ms = settled_ms
        self.max_runs = max_runs
        self.runs: dict[str, Run] = {}
        self._settled: OrderedDict[str, int] = OrderedDict()  # run id -> when it settled (now_ms), oldest first
        self._active: OrderedDict[str, None] = OrderedDict()  # the others, least recently updated first
        # (view, state|None, agent|None, reason|None) -> (since_ts, run_id) of the runs in an ATTENTION state
        # that match, oldest first; view: "open" (needs a person) or "closed" (a person abandoned or acknowledged it).
        self._lists: dict[tuple, SortedList] = {}
        self.groups: Counter = Counter()  # (agent, state, reason) -> open runs that need a person
        self.actions: OrderedDict[str, list[dict]] = OrderedDict()  # run id -> its last HISTORY actions, oldest first
        self.jobs: dict[str, dict[int, str]] = {}  # job id -> attempt -> run id
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
        if t.from_state is None:
            run.started_ts = t.ts
        job_id, attempt = t.evidence.job_id, t.evidence.attempt
        if job_id is not msgspec.UNSET and attempt is not msgspec.UNSET:
            run.job_id, run.attempt = job_id, attempt
            self.jobs.setdefault(job_id, {})[attempt] = run.run_id
        run.closed = self._closing(run)
        self._count(run, now_ms)
        minute = t.ts // MINUTE_MS
        if minute > now_ms // MINUTE_MS - 60:  # in the last hour
            self._minutes.setdefault(minute, Counter())[self._agent_key(run.agent), t.to_state] += 1
        self.expire(now_ms)
        self.version += 1
        return run

    def add_action(self, raw: bytes, now_ms: int) -> dict | None:
        """Fold one recovery_action (JSON bytes from agent.actions); its summary, or None if ignored."""
        try:
            a = _decode_action(raw)
        except (msgspec.ValidationError, msgspec.DecodeError, RecursionError):
            self.ignored["undecodable_action"] += 1
            return None
        kept = self.actions.get(a.run_id)
        if kept is None:
            kept = self.actions[a.run_id] = []
            if len(self.actions) > self.max_runs:  # bounded like the runs: the run first acted on goes
                self.actions.popitem(last=False)
        elif any(k["action_id"] == a.action_id for k in kept):
            self.ignored["repeat_action"] += 1
            return None
        entry = action_summary(a)
        kept.append(entry)
        kept.sort(key=lambda k: k["ts"])
        if len(kept) > HISTORY:
            del kept[:-HISTORY]
        self.jobs.setdefault(a.job_id, {}).setdefault(a.attempt, a.run_id)
        run = self.runs.get(a.run_id)
        if run is not None:
            if run.job_id is None:
                run.job_id, run.attempt = a.job_id, a.attempt
            closed = self._closing(run)
            if closed is not run.closed:
                self._uncount(run)
                run.closed = closed
                self._count(run, now_ms)
        self.version += 1
        return entry

    def _closing(self, run: Run) -> dict | None:
        """The person's action that keeps the run off the list now: an abandon ever, an acknowledge made in
        its present state; the latest such."""
        for a in reversed(self.actions.get(run.run_id, ())):
            if a["action"] == "abandon" or (a["action"] == "acknowledge" and a["ts"] >= run.since_ts):
                return a
        return None

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
            agent = run.agent or NO_AGENT
            view = "open" if run.closed is None else "closed"
            for k in _index_keys(view, run.state, agent, run.reason):
                listed = self._lists.get(k)
                if listed is None:
                    listed = self._lists[k] = SortedList()
                listed.add(key)
            if view == "open":
                self.groups[agent, run.state, run.reason] += 1

    def _uncount(self, run: Run) -> None:
        self.by_state[run.state] -= 1
        counts = self.by_agent.get(self._agent_key(run.agent))
        if counts is not None:
            counts[run.state] -= 1
        if run.state in ATTENTION:
            key = (run.since_ts, run.run_id)
            agent = run.agent or NO_AGENT
            view = "open" if run.closed is None else "closed"
            for k in _index_keys(view, run.state, agent, run.reason):
                listed = self._lists.get(k)
                if listed is not None:
                    listed.discard(key)
                    if not listed:
                        del self._lists[k]
            if view == "open":
                group = (agent, run.state, run.reason)
                self.groups[group] -= 1
                if self.groups[group] <= 0:
                    del self.groups[group]

    def _drop(self, run_id: str) -> None:
        run = self.runs.pop(run_id)
        self._uncount(run)
        self._settled.pop(run_id, None)
        self._active.pop(run_id, None)
        self.actions.pop(run_id, None)
        if run.job_id is not None:
            attempts = self.jobs.get(run.job_id)
            if attempts is not None and attempts.get(run.attempt) == run_id:
                del attempts[run.attempt]
                if not attempts:
                    del self.jobs[run.job_id]

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

    def attention(self, *, state: str | None = None, agent: str | None = None, reason: str | None = None,
                  closed: bool = False, offset: int = 0, limit: int = 200) -> tuple[list[Run], int]:
        """Runs that need a person (ATTENTION states; ``closed``: those a person abandoned or acknowledged),
        oldest in their state first, filtered, from ``offset``: the page and how many match in all."""
        listed = self._lists.get(("closed" if closed else "open", state, agent, reason))
        if listed is None:
            return [], 0
        runs = self.runs
        return [runs[run_id] for _since, run_id in listed.islice(offset, offset + limit)], len(listed)

    def matching(self, *, state: str | None = None, agent: str | None = None, reason: str | None = None,
                 limit: int = 10_000) -> list[str]:
        """The ids of the open runs a filter matches, at most ``limit`` (acting on a group)."""
        listed = self._lists.get(("open", state, agent, reason), ())
        return [run_id for _since, run_id in listed[:limit]]

    def group_counts(self, *, state: str | None = None, agent: str | None = None, reason: str | None = None,
                     limit: int = GROUPS_MAX) -> tuple[list[dict], int]:
        """The open runs that need a person, counted by agent, state and reason (within the filter), the
        largest group first: at most ``limit`` groups, and how many groups there are."""
        rows = [(n, a, s, r) for (a, s, r), n in self.groups.items()
                if (state is None or s == state) and (agent is None or a == agent) and (reason is None or r == reason)]
        rows.sort(key=lambda g: (-g[0], g[1], g[2], g[3]))
        return [{"agent": a, "state": s, "reason": r, "runs": n} for n, a, s, r in rows[:limit]], len(rows)

    def find(self, text: str, limit: int = 20) -> list[str]:
        """Run ids on the board: the exact id first, else those that start with ``text`` (at most ``limit``)."""
        if text in self.runs:
            return [text]
        out = []
        for run_id in self.runs:
            if run_id.startswith(text):
                out.append(run_id)
                if len(out) >= limit:
                    break
        return sorted(out)

    def snapshot(self, now_ms: int, *, state: str | None = None, agent: str | None = None,
                 reason: str | None = None, closed: bool = False, offset: int = 0, limit: int = 200) -> dict:
        """What the board shows: counts now and over the last hour, the runs that need a person (a page of
        them, filtered) and their groups."""
        hour_state, hour_agent = self.hour(now_ms)
        agents = sorted(set(self.by_agent) | set(hour_agent))
        rows, matched = self.attention(state=state, agent=agent, reason=reason, closed=closed, offset=offset,
                                       limit=limit)
        groups, groups_total = self.group_counts(state=state, agent=agent, reason=reason)
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
            "attention": [summary(r, now_ms) for r in rows],
            "attention_total": len(self._lists.get(("open", None, None, None), ())),
            "closed_total": len(self._lists.get(("closed", None, None, None), ())),
            "matched": matched,
            "offset": offset,
            "limit": limit,
            "filter": {"state": state, "agent": agent, "reason": reason, "closed": closed},
            "groups": groups,
            "groups_total": groups_total,
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
        # A run that declared no job is its job's first and only attempt (docs/contract.md section 12).
        attempts = [] if run.job_id is not None else [
            {"attempt": 1, "run_id": run.run_id, "state": run.state, "since_ts": run.since_ts}]
        if run.job_id is not None:
            for attempt, attempt_run in sorted(self.jobs.get(run.job_id, {}).items()):
                other = self.runs.get(attempt_run)
                attempts.append({"attempt": attempt, "run_id": attempt_run,
                                 "state": None if other is None else other.state,
                                 "since_ts": None if other is None else other.since_ts})
        return {**summary(run, now_ms), "action": ACTIONS.get(run.state, ""), "transitions": transitions,
                "needs_person": run.state in ATTENTION and run.closed is None, "run_started_ts": run.started_ts,
                "attempts": attempts, "actions": list(reversed(self.actions.get(run_id, [])))}
