"""The run table's timer service: one per-event driver, one scheduling policy and one due-firing loop for both
shells.

Replay (``loopwarden.replay``) and the Kafka health stage (``loopwarden.stages.health.task``)
keep their runs' states differently (a dict of live states; a store of committed bytes
under a batch's overlay) and hand the table a ``load(run_id)`` for them. Everything about
*when* a run is looked at again lives here: :meth:`RunTable.step` drives each event through
the core and queues its run's timer, :meth:`RunTable.changed` after every change of a run,
:meth:`RunTable.fire_due` when the clock moves. No shell reads the
:class:`~loopwarden.rules.timers.TimerQueue`.

Retention and tombs are timers like the others (``fire_next`` drops a settled run to
its tomb, then forgets the tomb): the shell stores whatever state a firing returns.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterator

from loopwarden.rules.conditions import _BY_ID, compile_policy
from loopwarden.rules.machine import _TIMERLESS, DEADLINE_KEEPING, Result, RunState, Settings, _ms, apply_into, fire_next
from loopwarden.rules.timers import TimerQueue

_NEVER = 1 << 62


class RunTable:
    """The due timers of a shell's runs (at most one entry per run, O(due) per tick)."""

    __slots__ = ("settings", "load", "key", "firing", "_timers", "heap", "_queued", "_retention_ms", "_forget_ms")

    def __init__(self, settings: Settings, load: Callable[[Hashable], RunState | None],
                 key: Callable[[str], Hashable] | None = None) -> None:
        self.settings = settings
        self._retention_ms = _ms(settings.retention_s)  # as next_deadline rounds them
        self._forget_ms = _ms(settings.seq_memory_s)
        self.load = load  # a run's key -> its current state in the shell (None: not held)
        # run id -> the key the queue names the run by (None: the run id itself). The worker names runs by their
        # store key (``str.encode``) and writes its store under the object the queue holds (``held``): one object
        # per run for both.
        self.key = key
        self.firing: Hashable | None = None  # during fire_due: the key of the run just yielded
        self._timers = TimerQueue()
        # The queue's read-only views (TimerQueue documents them): a call saved per event. ``heap`` is
        # public for read only: ``heap and heap[0] <= now`` is ``due(now)``, for a shell's per-event peek.
        self.heap = self._timers.heap
        self._queued = self._timers.queued

    def deadline(self, state: RunState) -> int | None:
        """``next_deadline(state, self.settings)`` in one call (the settings' durations worked out once): the
        run's earliest deadline, or None. A copy (tests/unit/test_hot_path_copies.py): next_deadline's three
        calls deep cost 0.8 % of ``Replay.feed``'s instructions (bench/HISTORY.md "a core")."""
        health = state.health
        if health == "RUNNING":
            last = state.last_activity_ts
            if last is None:
                return None
            policy = state.policy
            return last + (_BY_ID.get(id(policy)) or compile_policy(policy)).inactivity_ms
        if health in _TIMERLESS:
            return state.last_seen_ts + (self._forget_ms if state.tomb else self._retention_ms)
        if health == "VERIFYING":
            return state.verify_deadline_ts
        if health == "WAITING":
            approval = state.approval
            return None if approval is None else approval.deadline_ts
        return None

    def step(self, res: Result, state: RunState | None, event, now: int, clock: int, noted: dict,
             schedule: bool = True) -> RunState:
        """One event of a run through the core, the per-event driver both shells call (``Replay.feed``,
        ``PartitionTask.fold``): apply it (``apply_into``), count its notes in ``noted``, and with ``schedule``
        (timers on the event clock) queue the run's timer as it is now, by :meth:`changed`'s policy. Returns the
        run's new state; its transitions stay in ``res.transitions`` for the shell to hand on, and the shell
        fires what became due. A failed event leaves nothing in ``res`` for the next one."""
        try:
            new = apply_into(res, state, event, now, clock)
        except BaseException:
            del res.transitions[:], res.notes[:], res.actions[:]
            raise
        notes = res.notes
        if notes:
            for note in notes:
                noted[note] = noted.get(note, 0) + 1
            notes.clear()
        # changed()'s first test, inline: after most step events nothing is looked at, and no call is made
        if schedule and (res.transitions or new is not state or event.__class__ not in DEADLINE_KEEPING):
            self.changed(new, bool(res.transitions))
        return new

    def changed(self, state: RunState, transitioned: bool, event_type: type | None = None,
                run: Hashable | None = None) -> None:
        """The scheduling policy, after a run changed (by an event of ``event_type``, or by anything when None).

        A change of health (``transitioned``) makes the new timer the run's deadline at once,
        later or earlier (no stale look when the old one passes). Otherwise the deadline can
        only have moved earlier, and is queued only if so; after an event that never moves it
        earlier (``DEADLINE_KEEPING``) nothing is looked at. ``run``: the run's key, when the shell has it."""
        if run is None:
            run = state.run_id if self.key is None else self.key(state.run_id)
        if transitioned:
            self._timers.reschedule(run, self.deadline(state))
        elif event_type is None or event_type not in DEADLINE_KEEPING:
            deadline = self.deadline(state)
            if deadline is not None and deadline < self._queued.get(run, _NEVER):
                self._timers.schedule(run, deadline)

    def held(self, run: Hashable) -> Hashable | None:
        """The key object the queue holds for this run, or None (``TimerQueue.held``)."""
        return self._timers.held(run)

    def due(self, now_ms: int) -> bool:
        """Whether :meth:`fire_due` at ``now_ms`` would look at anything."""
        heap = self.heap
        return bool(heap) and heap[0] <= now_ms

    def fire_due(self, now_ms: int) -> Iterator[tuple[RunState, str | None, Result]]:
        """Fire every due timer in deadline order: ``(state, its health before, result)`` per run fired
        (``fire_next`` updates the state in place: ``result.state`` may be that same object).

        The shell stores ``result.state`` (None: forgotten) and calls :meth:`changed` as for
        any change before taking the next one. A run whose deadline moved since it was queued
        is queued again, not fired."""
        settings, load, timers = self.settings, self.load, self._timers
        for deadline, run_id in timers.pop_due(now_ms):
            state = load(run_id)
            if state is None:
                continue
            current = self.deadline(state)
            if current != deadline:
                timers.schedule(run_id, current)  # moved since queued
                continue
            health = state.health
            self.firing = run_id  # the queue's own key object: the shell's changed() can name the run with it
            yield state, health, fire_next(state, now_ms, settings)

    def nbytes(self, keys: bool = True) -> int:
        """Bytes its timer queue holds (``TimerQueue.nbytes``), for memory benches."""
        return self._timers.nbytes(keys)

    def clear(self) -> None:
        self._timers.clear()

    def __len__(self) -> int:
        """Timer entries held (live or superseded)."""
        return len(self._timers)
