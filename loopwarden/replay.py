"""Offline replay (spec.md section 8): the rules core on an event-time clock.

Bytes in (any chunking), transitions out. Before each event the clock moves to
the event's ``ts`` (never backwards) and due timers fire in deadline order; at
the end the clock can be advanced further so windows and timeouts run out.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from loopwarden.codecs import HealthTransition, InputEvent, InvalidEvent, decode_input
from loopwarden.rules import DEFAULT_SETTINGS, RunState, Settings, apply, fire_next, next_deadline
from loopwarden.rules.machine import Result
from loopwarden.rules.timers import TimerQueue


@dataclass(frozen=True)
class BadLine:
    source: str
    line: int
    reason: str
    message: str

    def __str__(self) -> str:
        return f"{self.source}:{self.line}: invalid event ({self.reason}): {self.message}"


class Replay:
    """Feed events in order; collect transitions. One instance per replay."""

    def __init__(self, settings: Settings = DEFAULT_SETTINGS) -> None:
        self.settings = settings
        self.states: dict[str, RunState] = {}
        self.final: dict[str, HealthTransition] = {}
        self.notes: Counter[tuple[str, str]] = Counter()
        self.clock: int | None = None
        self._timers = TimerQueue()
        self._heap = self._timers.heap
        self._queued = self._timers.queued

    def _count(self, notes: list[tuple[str, str]]) -> None:
        counted = self.notes  # not Counter.update: its generic path costs more than the notes
        for note in notes:
            counted[note] = counted.get(note, 0) + 1

    def _take(self, res: Result, run_id: str) -> list[HealthTransition]:
        if res.notes:
            self._count(res.notes)
        state = res.state
        if state is None:
            self.states.pop(run_id, None)
        else:
            self.states[run_id] = state
            self._timers.schedule(run_id, next_deadline(state, self.settings))
        transitions = res.transitions
        if transitions:
            self.final[run_id] = transitions[-1]
        return transitions

    def advance_to(self, now_ms: int) -> list[HealthTransition]:
        """Move the clock to ``now_ms`` (never backwards) and fire due timers in deadline order."""
        clock = self.clock
        if clock is None or now_ms > clock:
            self.clock = clock = now_ms
        if not self._timers.due(clock):
            return []
        out: list[HealthTransition] = []
        for deadline, run_id in self._timers.pop_due(clock):
            state = self.states.get(run_id)
            if state is None:
                continue
            current = next_deadline(state, self.settings)
            if current != deadline:
                self._timers.schedule(run_id, current)  # the deadline moved since it was queued
                continue
            out += self._take(fire_next(state, clock, self.settings), run_id)
        return out

    def feed(self, event: InputEvent) -> list[HealthTransition]:
        ts = event.ts
        clock = self.clock
        if clock is None or ts > clock:
            self.clock = clock = ts
        heap = self._heap  # TimerQueue.due, inline (the hot path)
        out = self.advance_to(clock) if heap and heap[0] <= clock else None
        run_id = event.run_id
        states = self.states
        state = states.get(run_id)
        res = apply(state, event, clock)
        # _take, inline: one event, one run
        if res.notes:
            self._count(res.notes)
        if res.state is not state:  # a new run, or one back from its tomb
            state = states[run_id] = res.state  # type: ignore[assignment]
        # From here on the run id is the state's own string, the very object the dicts below hold
        # as their key: a lookup compares identities, not the characters of a string decoded anew.
        run_id = state.run_id  # type: ignore[union-attr]
        deadline = next_deadline(state, self.settings)  # type: ignore[arg-type]
        transitions = res.transitions
        if transitions:  # its health changed: another timer, queued as it is now
            self._timers.reschedule(run_id, deadline)
            self.final[run_id] = transitions[-1]
            if out:
                out += transitions
                return out
        elif deadline is not None:  # the same timer, maybe moved: queued again only if earlier
            queued = self._queued.get(run_id)  # TimerQueue.schedule's early return, inline
            if queued is None or deadline < queued:
                self._timers.schedule(run_id, deadline)
        return out or transitions

    def finish(self, advance_s: float = 0.0) -> list[HealthTransition]:
        """After the last event: advance the clock by ``advance_s`` and fire due timers."""
        if self.clock is None:
            return []
        return self.advance_to(self.clock + int(round(advance_s * 1000)))


def iter_lines(chunks: Iterable[bytes]) -> Iterator[bytes]:
    """Reassemble lines from chunks of any size (the last line may lack a newline)."""
    buf = b""
    for chunk in chunks:
        buf += chunk
        *lines, buf = buf.split(b"\n")
        yield from lines
    if buf:
        yield buf


def replay_lines(
    lines: Iterable[tuple[str, int, bytes]],
    replay: Replay,
    on_transition: Callable[[HealthTransition], None],
    on_bad: Callable[[BadLine], None],
) -> int:
    """Run numbered lines through ``replay``; returns the count of invalid lines."""
    bad = 0
    for source, number, raw in lines:
        if not raw.strip():
            continue
        try:
            event = decode_input(raw)
        except InvalidEvent as exc:
            bad += 1
            on_bad(BadLine(source, number, exc.reason, str(exc)))
            continue
        for t in replay.feed(event):
            on_transition(t)
    return bad


def summary_table(replay: Replay) -> str:
    """Final state and reason of every run, counted, plus ignored events and disagreements."""
    rows = Counter((t.to_state, t.reason) for t in replay.final.values())
    lines = [f"{'final state':<20} {'reason':<26} {'runs':>6}"]
    lines += [f"{s:<20} {r:<26} {n:>6}" for (s, r), n in sorted(rows.items())]
    lines.append(f"{'total':<47} {sum(rows.values()):>6}")
    extra = sorted((k, v, n) for (k, v), n in replay.notes.items() if k in ("ignored", "disagreement", "receipt"))
    if extra:
        lines.append("")
        lines.append(f"{'counted':<20} {'kind':<26} {'events':>6}")
        lines += [f"{k:<20} {v:<26} {n:>6}" for k, v, n in extra]
    return "\n".join(lines)
