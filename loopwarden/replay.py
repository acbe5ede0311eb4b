"""Offline replay (docs/contract.md section 8): the rules core on an event-time clock.

Bytes in (any chunking), transitions out. Before each event the clock moves to
the event's ``ts`` (never backwards) and due timers fire in deadline order (and
after it, if it set a deadline already past); at the end the clock can be
advanced further so windows and timeouts run out.
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass

from loopwarden.codecs import (
    HealthTransition,
    InputEvent,
    InvalidEvent,
    OutcomeReceipt,
    RunStarted,
    decode_input,
    decode_outcome_event,
)
from loopwarden.rules import DEFAULT_SETTINGS, RunState, Settings
from loopwarden.codecs.events import OperatorAction, RecoveryAction, RecoveryPolicy
from loopwarden.rules.machine import Result, unknown_run
from loopwarden.rules.recovery import with_default
from loopwarden.rules.table import RunTable


@dataclass(frozen=True)
class BadLine:
    source: str
    line: int
    reason: str
    message: str

    def __str__(self) -> str:
        return f"{self.source}:{self.line}: invalid event ({self.reason}): {self.message}"


class Replay:
    """Feed events in order; collect transitions. One instance per replay.

    Memory follows the runs held (retention drops them), not the runs ever seen:
    :meth:`final_counts` works from the states held plus a count of the runs
    dropped. ``keep_final=True`` also keeps ``final``, every run's last transition
    (evidence and all) for as long as the replay lives: for tests and comparisons
    that look up runs by id. Retaining those objects costs memory per run ever seen
    and, measured on the bench fleet, about 6 % of replay's time.
    """

    def __init__(self, settings: Settings = DEFAULT_SETTINGS, keep_final: bool = False, verifiers=None,
                 channel: str | None = None, recovery_defaults: Mapping[str, RecoveryPolicy] | None = None,
                 on_action: Callable[[RecoveryAction], None] | None = None) -> None:
        self.settings = settings
        # docs/recovery.md: the agents' default recovery policies (filled into run_started as the worker does),
        # the keys a person's operator action must be signed by (the human receipts' own), and where the
        # recovery actions go (None: decided and dropped).
        self.recovery_defaults = recovery_defaults or None
        self.verifiers = verifiers
        self.on_action = on_action
        self.unknown_run_actions = 0  # operator actions for a run not held: the worker dead-letters them
        # The event types _prepare looks at before the core: operator actions always, receipts and run_started
        # only when a setting needs it.
        self._prepared = frozenset((OperatorAction, *((RunStarted,) if self.recovery_defaults else ())))
        # docs/contract.md section 10, docs/receipts.md: with loopwarden.trust.TrustedVerifiers and/or the trusted
        # receipts topic (``channel``), receipts are classified before apply as in the worker; else all count.
        self.trust = None
        if verifiers is not None or channel is not None:
            from loopwarden.trust import ReceiptTrust

            self.trust = ReceiptTrust(verifiers, channel)
            self._prepared |= {OutcomeReceipt}
        self.states: dict[str, RunState] = {}
        self.final: dict[str, HealthTransition] = {}  # filled only with keep_final
        self.keep_final = keep_final
        # The last (state, reason) of runs retention dropped: while their tomb is held (the run id
        # may come back, and then its new transitions count instead), and once it is forgotten.
        self._tombs_final: dict[str, tuple[str, str]] = {}
        self._forgotten: Counter[tuple[str, str]] = Counter()
        self.notes: dict[tuple[str, str], int] = {}  # note -> times counted (a plain dict: Counter's item
        # assignment takes a slower path than dict's, and notes are counted on every run_ended)
        self.clock: int | None = None
        self._timers = RunTable(settings, self.states.get)  # the runs' due timers: one policy with the worker's
        self._res = Result(None)  # every event's transitions and notes, taken out after it (RunTable.step)
        self._heap = self._timers.heap  # read only: ``heap and heap[0] <= now`` is ``RunTable.due(now)``, a call saved

    def _count(self, notes: list[tuple[str, str]]) -> None:
        counted = self.notes
        for note in notes:
            counted[note] = counted.get(note, 0) + 1

    def _prepare(self, event: InputEvent, on_channel: bool):
        """What the core is handed for a receipt (classified by trust), a run_started (its agent's default recovery
        policy filled in) or an operator action (classified by key; None: a run not held, counted)."""
        cls = type(event)
        if cls is OutcomeReceipt:
            return self.trust.classify(event, on_channel)  # type: ignore[union-attr]
        if cls is RunStarted:
            return with_default(event, self.recovery_defaults)  # type: ignore[arg-type]
        if unknown_run(self.states.get(event.run_id)):  # an operator action
            self.unknown_run_actions += 1
            self._count([("operator_action", "unknown_run")])
            return None
        return event if self.verifiers is None else self.verifiers.classify_action(event)  # type: ignore[arg-type]

    def _actions(self, res: Result) -> None:
        actions, res.actions = res.actions, []
        if self.on_action is not None:
            for action in actions:
                self.on_action(action)

    def _take(self, res: Result, run_id: str, before: RunState) -> list[HealthTransition]:
        if res.notes:
            self._count(res.notes)
        if res.actions:
            self._actions(res)
        state = res.state
        if state is not before:  # retention dropped the run (to its tomb or for good), or forgot its tomb
            if before.tomb:
                last = self._tombs_final.pop(run_id, None)
                if last is not None:
                    self._forgotten[last] += 1
            elif before.history:
                _seq, _ts, to, reason = before.history[-1]
                if state is None:
                    self._forgotten[to, reason] += 1
                else:
                    self._tombs_final[run_id] = (to, reason)
        transitions = res.transitions
        if state is None:
            self.states.pop(run_id, None)
        else:
            self.states[run_id] = state
            self._timers.changed(state, bool(transitions))
        if transitions and self.keep_final:
            self.final[run_id] = transitions[-1]
        return transitions

    def final_counts(self) -> Counter[tuple[str, str]]:
        """Runs by the state and reason of their last transition: the runs held and those dropped.

        The same counts as over ``final`` (with ``keep_final``), without keeping a transition per run."""
        counts = Counter(self._forgotten)
        counts.update(self._tombs_final.values())
        for state in self.states.values():
            if state.history and not state.tomb:
                _seq, _ts, to, reason = state.history[-1]
                counts[to, reason] += 1
        return counts

    def advance_to(self, now_ms: int) -> list[HealthTransition]:
        """Move the clock to ``now_ms`` (never backwards) and fire due timers in deadline order."""
        clock = self.clock
        if clock is None or now_ms > clock:
            self.clock = clock = now_ms
        if not self._timers.due(clock):
            return []
        out: list[HealthTransition] = []
        for state, _health, res in self._timers.fire_due(clock):
            out += self._take(res, state.run_id, state)
        return out

    def feed(self, event: InputEvent, on_channel: bool = False) -> list[HealthTransition]:
        """Apply one event; ``on_channel``: a receipt read from the trusted receipts topic."""
        if type(event) in self._prepared:  # one test per event: a chain of class tests cost ~1.5 % of feed
            event = self._prepare(event, on_channel)  # type: ignore[assignment]
            if event is None:
                return []
        ts = event.ts
        clock = self.clock
        if clock is None or ts > clock:
            self.clock = clock = ts
        heap = self._heap
        out = self.advance_to(clock) if heap and heap[0] <= clock else None
        run_id = event.run_id
        states = self.states
        state = states.get(run_id)
        res = self._res  # this replay's one Result: the driver leaves the event's transitions and actions in it
        new = self._timers.step(res, state, event, clock, clock, self.notes)  # the driver the health task calls too
        if new is not state:  # a new run, or one back from its tomb
            if state is not None:  # back from its tomb: its new life's transitions count, not the last one's
                self._tombs_final.pop(run_id, None)
            state = states[run_id] = new
        transitions = res.transitions
        if res.actions:  # a recovery action comes with a transition, or from a person's action
            self._actions(res)
        if transitions:
            res.transitions = []  # the list is handed on: the next event gets a new one
            if self.keep_final:
                # The state's own run id string, the very object the dicts hold as their key: a lookup
                # compares identities, not the characters of a string decoded anew.
                self.final[state.run_id] = transitions[-1]  # type: ignore[union-attr]
        if heap and heap[0] <= clock:  # a deadline already past (an approval's): it fires now, as in the worker
            return (out or []) + transitions + self.advance_to(clock)
        if out:
            out += transitions
            return out
        return transitions

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


class _Decoded:
    """Numbered lines decoded into events; an invalid one is handed to ``on_bad`` and counted in ``bad``."""

    def __init__(self, on_bad: Callable[[BadLine], None]) -> None:
        self.on_bad = on_bad
        self.bad = 0

    def events(self, lines: Iterable[tuple[str, int, bytes]], decode=decode_input) -> Iterator[InputEvent]:
        for source, number, raw in lines:
            if not raw.strip():
                continue
            try:
                event = decode(raw)
            except InvalidEvent as exc:
                self.bad += 1
                self.on_bad(BadLine(source, number, exc.reason, str(exc)))
                continue
            yield event


def replay_lines(
    lines: Iterable[tuple[str, int, bytes]],
    replay: Replay,
    on_transition: Callable[[HealthTransition], None],
    on_bad: Callable[[BadLine], None],
) -> int:
    """Run numbered lines through ``replay``; returns the count of invalid lines."""
    decoded = _Decoded(on_bad)
    for event in decoded.events(lines):
        for t in replay.feed(event):
            on_transition(t)
    return decoded.bad


def replay_with_channel(
    lines: Iterable[tuple[str, int, bytes]],
    channel: Iterable[tuple[str, int, bytes]],
    replay: Replay,
    on_transition: Callable[[HealthTransition], None],
    on_bad: Callable[[BadLine], None],
) -> int:
    """:func:`replay_lines` with a second source: receipts read from the verifiers' trusted topic (``channel``;
    ``replay`` built with that topic as its ``channel``), merged into ``lines`` by ``ts`` as the worker merges
    its inputs (each source in its own order, ``lines`` first on a tie). A ``channel`` line that is not an
    ``outcome_receipt`` is invalid there, as the worker dead-letters it. Returns the count of invalid lines."""
    decoded = _Decoded(on_bad)
    ordinary = ((e.ts, e, False) for e in decoded.events(lines))
    trusted = ((e.ts, e, True) for e in decoded.events(channel, decode_outcome_event))
    # heapq.merge is stable: on equal ts the ordinary lines (the first source) come first
    for _, event, on_channel in heapq.merge(ordinary, trusted, key=_ts):
        for t in replay.feed(event, on_channel):
            on_transition(t)
    return decoded.bad


def _ts(item: tuple) -> int:
    return item[0]


def summary_table(replay: Replay) -> str:
    """Final state and reason of every run, counted, plus ignored events and disagreements."""
    rows = replay.final_counts()
    lines = [f"{'final state':<20} {'reason':<26} {'runs':>6}"]
    lines += [f"{s:<20} {r:<26} {n:>6}" for (s, r), n in sorted(rows.items())]
    lines.append(f"{'total':<47} {sum(rows.values()):>6}")
    extra = sorted((k, v, n) for (k, v), n in replay.notes.items() if k in ("ignored", "disagreement", "receipt"))
    if extra:
        lines.append("")
        lines.append(f"{'counted':<20} {'kind':<26} {'events':>6}")
        lines += [f"{k:<20} {v:<26} {n:>6}" for k, v, n in extra]
    return "\n".join(lines)
