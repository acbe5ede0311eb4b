"""One owned partition's work on a batch, without Kafka: decode → fold in the pure core → outputs.

The engine (``loopwarden.engine.loop``, running the health stage of
``loopwarden.stages.health.stage``) hands every consumed batch of a partition to
:meth:`PartitionTask.fold` and commits the returned :class:`Batch` in one Kafka
transaction: its transitions, its dead letters, **one changelog record per run
touched** (the run's last state in the batch) and the consumed offsets. Only once the
transaction is committed does the loop call :meth:`PartitionTask.committed`, which
writes those states to the store: the store (and the HTTP read model over it) holds
committed state only, so an aborted transaction needs no undo beyond :meth:`discard`.

Within a partition, steps and receipts are applied in event-time order (a merge of
the two topics' records by ``ts``, each topic kept in offset order), so paths stay
close to offline replay's; ticks come after the inputs of the batch.

Timers (a :class:`~loopwarden.rules.table.RunTable` per partition) fire inside the batch, so their
transitions commit with it. The event clock is the latest ``ts`` applied (and ticks on event time); a
late event counts from it (docs/contract.md section 5). On event time due timers fire around each
event (a heap peek) as in replay; on the wall clock :meth:`fold` fires them after the inputs when asked.
"""

from __future__ import annotations

import heapq
import logging
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from operator import itemgetter

from loopwarden.rules import RunState, Settings, decode_state
from loopwarden.rules.machine import DEADLINE_KEEPING, Result, apply_into
from loopwarden.rules.recovery import unknown_run, with_default
from loopwarden.rules.table import RunTable
from loopwarden.codecs.events import OperatorAction, RecoveryPolicy, RunStarted
from loopwarden.engine.alignment import ALIGNED, StreamTime
from loopwarden.stages.health.batchend import BatchEnd
from loopwarden.stages.health.batch import CLOCK_KEY, Batch, _decode_clock, is_meta, wall_clock_ms  # noqa: F401
from loopwarden.stages.health.inputs import Record, Tick, decode_input, decode_records, decode_tick, encode_tick, header  # noqa: F401
from loopwarden.stages.health.inputs import merge_by_ts
from loopwarden.stages.health.hotstates import LIMIT as HOT_RUNS, HotStates
from loopwarden.api.readmodel import RunsIndex
from loopwarden.stages.health.settle import SETTLE_KEY, Settling, misplaced, settling_for
from loopwarden.engine.stage import DeadLetter, Output
from loopwarden.stages.health.topology import LAYOUT_KEY, Placement, decode_expansion

log = logging.getLogger("loopwarden.task")

_PREPARED = frozenset((RunStarted, OperatorAction))
_ACTIONS_ONLY = frozenset((OperatorAction,))
_ABSENT = object()  # not touched by the batch being folded (None in ``_live`` means dropped by retention)
_event_of = itemgetter(1)


class PartitionTask(BatchEnd):
    """A partition's run states (committed, in ``store``), its due-timer queue and its clock."""

    def __init__(
        self,
        partition: int,
        store: Mapping[bytes, bytes],
        roles: Mapping[str, str],
        *,
        settings: Settings,
        clock: str = "wall",
        wall_ms: Callable[[], int] = wall_clock_ms,
        max_future_ms: int = 300_000,
        health_topic: str = "agent.health",
        actions_topic: str = "agent.actions",
        recovery_defaults: Mapping[str, RecoveryPolicy] | None = None,
        trust=None,
        partitions: int | None = None,
        hot_runs: int = HOT_RUNS,
        settle: tuple[int, ...] = (1000, 600_000),  # after an expansion: settle ms, window ms, stash bytes at most
    ) -> None:
        self.partition = partition
        self.health_topic = health_topic
        # docs/recovery.md: where recovery actions go, the agents' default recovery policies (None: none), and the
        # keys a person's operator action must be signed by (the human receipts' own; None: every one is refused).
        self.actions_topic = actions_topic
        self.recovery_defaults = recovery_defaults or None
        self.action_keys = None if trust is None else trust.verifiers
        # Whether a record of a run this partition does not hold belongs here (None: not checked).
        self.placement = None if partitions is None else Placement(partition, partitions)
        self._forwarded: list[Output] = []  # records forwarded to their partition (loopwarden topics expand)
        self.settling: Settling | None = None  # after an expansion: moved runs' records wait for their forwarded ones
        self._settle = settle
        self.store = store  # committed states: run id (UTF-8) -> encode_state bytes
        self.roles = roles  # topic -> "steps" | "outcomes" | "verified_outcomes" | "ticks"
        self.settings = settings
        self.clock_mode = clock
        self.wall_ms = wall_ms
        # An event stamped further ahead of this worker's wall clock is dead-lettered: one such
        # message would move the event clock (or its run's timers) to the end of time. Ticks are
        # the operator's tool to move the clock (backfills, tests): trusted, not bounded.
        self.max_future_ms = max_future_ms
        # loopwarden.trust.ReceiptTrust or None (every receipt counts): receipts are classified before the core.
        self.trust = trust
        # The runs' due timers, one policy with replay's; named by store keys, held once (_key): no second object per run.
        self.timers = RunTable(settings, lambda key: self.load(key.decode()), str.encode)
        self.clock = 0  # event-time clock (clock == "event"), committed with the batch that moved it
        self.state_counts: Counter = Counter()  # health -> runs, committed
        # States touched by the batch being folded; None: dropped by retention in this batch
        # (the store still holds its committed state, which must not come back).
        self._live: dict[str, RunState | None] = {}
        self._before: dict[str, str | None] = {}  # their committed health
        self._moved: set[str] = set()  # runs whose health changed in the batch (a new timer: rescheduled)
        self._res = Result(None)  # every event's transitions and notes (apply_into), emptied after each
        self.hot = HotStates(hot_runs)  # committed states kept decoded between batches
        self._clock_before = 0
        self.stream = StreamTime(roles, ALIGNED)  # stream times, records held for a lagging input
        self.index = RunsIndex(store)  # the read API's ordered view of the committed runs (dropped with the task)

    # -- recovery -------------------------------------------------------------------
    def rebuild(self) -> int:
        """Timer queue, state counts and clock from the committed store (after restore); the runs held."""
        return sum(self.rebuild_steps())

    def rebuild_steps(self, step: int = 4096) -> Iterator[int]:
        """:meth:`rebuild` a few thousand runs at a time (~6 µs a run): yields how many each step read, so that an
        owning beside the loop (loopwarden.engine.reowning) lets the other partitions go on between steps."""
        self.timers.clear()
        self.state_counts.clear()
        self.index.clear()
        self.hot.clear()
        n = 0
        for key, raw in self.store.items():
            if is_meta(key):
                if key == CLOCK_KEY:
                    self.clock = _decode_clock(raw)
                elif key == LAYOUT_KEY and self.placement is not None:
                    self.placement.expansion = decode_expansion(raw)
                continue
            state = decode_state(raw, key.decode())
            n += 1
            self.state_counts[state.health] += 1
            self.timers.changed(state, True, run=key)  # the store's key object: shared
            self.index.add(key, state)
            if n == step:
                yield n
                n = 0
        self.settling = settling_for(self.partition, self.placement, self.store.get(SETTLE_KEY), self._settle,
                                     lambda h: decode_input(h, self.roles[h.topic], 2**63, self.max_future_ms))
        self.index.merge()  # sorted now, during recovery, not by the first read
        yield n

    # -- state within a batch ---------------------------------------------------------
    def load(self, run_id: str) -> RunState | None:
        """The run's state in the batch: as the batch left it, else its committed one (to be changed)."""
        state = self._live.get(run_id, _ABSENT)
        return self.hot.take(run_id, self.store) if state is _ABSENT else state  # type: ignore[return-value]

    def _take(self, run_id: str, res, out: Batch) -> None:
        counts = out.counts
        for kind, label in res.notes:
            counts[kind, label] += 1
        if res.transitions:
            out.transitions += res.transitions
            self._moved.add(run_id)
        if res.actions:
            out.actions += res.actions
        self._live[run_id] = res.state

    # -- the batch --------------------------------------------------------------------
    def fold(self, records: Iterable[Record], *, punctuate: bool = False, caught_up: bool = True,
             lagging: Collection[str] = ()) -> Batch:
        """Apply a batch of this partition's records (any input topic, offset order per topic).

        ``punctuate``: fire due timers after the inputs (the loop asks once per tick
        interval); only when ``caught_up`` (inputs consumed to their end): while a
        backlog drains, a run whose next steps are still in it must not look stuck.
        A tick record always fires due timers when caught up (and moves the event clock).

        ``lagging``: input roles (``steps``, ``outcomes``) whose topic holds more than has
        been consumed. A record of the other input stamped later than everything seen of a
        lagging one is not applied yet: it and the records after it on its topic are kept
        here (decoded; :attr:`holding` counts them) and folded first by a later call, and
        the batch's offsets stop before them. So the two inputs meet in event-time order
        across batches, not only within one (stream-time alignment, as Kafka Streams does).
        A call with no ``lagging`` folds everything held.
        """
        out = Batch()
        live, before, moved, hot, store = self._live, self._before, self._moved, self.hot, self.store
        live.clear()
        before.clear()
        moved.clear()
        hot.taken.clear()
        self._clock_before = self.clock
        stream = self.stream
        # input topic -> [(record, (role, event, record) | DeadLetter)], offset order: held ones first
        per_topic = stream.take_held()
        ticks = decode_records(records, self.roles, self.wall_ms() + self.max_future_ms, self.max_future_ms,
                               per_topic, out)
        inputs = stream.ready(per_topic, lagging, out)
        settling = self.settling  # moved runs' records wait for their forwarded ones (loopwarden.stages.health.settle)
        released = settling.divert(inputs, self.wall_ms(), out, stream.held) if settling is not None else None
        counts = out.counts
        for role, applied in inputs.items():  # counted at once: every event taken here is applied below
            for cls, n in Counter(map(type, map(_event_of, applied))).items():
                counts["event", role, cls.__struct_config__.tag] += n
        if released:
            inputs["moved"] = released  # in event-time order
        if len(inputs) == 2:
            merged = merge_by_ts(*inputs.values())
        elif len(inputs) > 2:  # the verifiers' receipts topic (LOOPWARDEN_TRUSTED_OUTCOMES_TOPIC), moved runs
            merged = heapq.merge(*inputs.values(), key=_ts)
        else:
            merged = next(iter(inputs.values()), ())
        trust = self.trust
        defaults, action_keys = self.recovery_defaults, self.action_keys
        prepared = _PREPARED if defaults is not None else _ACTIONS_ONLY
        placement = self.placement
        # One event clock in both modes (docs/contract.md section 5, "Event time and late events"). On event
        # time timers are queued and fired around each event as in replay; on the wall clock, at punctuation.
        event_mode = self.clock_mode == "event"
        timers = self.timers
        heap, clock, res = timers.heap, self.clock, self._res
        noted: dict = {}  # notes of the batch, added to counts at the end: a dict write per note, not a Counter's
        for role, event, rec in merged:
            run_id = event.run_id
            # load(), inline: one dict lookup per event of a run the batch already holds
            state = live.get(run_id, _ABSENT)
            if state is _ABSENT:
                state = hot.take(run_id, store)
                if state is None and placement is not None and misplaced(placement, rec, role, out, self._forwarded):
                    continue
                if run_id not in before:  # its committed health (a timer fired below sees the same)
                    before[run_id] = state.health if state is not None else None
            elif state is None and placement is not None and misplaced(placement, rec, role, out, self._forwarded):
                continue
            ts = event.ts
            if ts > clock:
                clock = ts
            if event_mode:
                now = clock
                if heap and heap[0] <= clock:  # RunTable.due, inline: a heap peek per event
                    self.fire_due(clock, out)
                    state = live.get(run_id, state)  # fired: its new state; else the one taken above, unchanged
            else:
                now = self.wall_ms()
            if type(event) in prepared:  # one test per event (docs/recovery.md): a run_started, an operator action
                if type(event) is RunStarted:  # the agent's default recovery policy, unless the run declares its own
                    event = with_default(event, defaults)  # type: ignore[arg-type]
                elif unknown_run(state):  # a person's action on a run not held: never made a run
                    out.deadletters.append(DeadLetter(rec, "unknown_run", f"operator_action for run {run_id!r}, "
                                                      "which loopwarden does not hold (never started, or dropped)"))
                    counts["invalid", role, "unknown_run"] += 1
                    counts["operator_action", "unknown_run"] += 1
                    continue
                elif action_keys is not None:  # trusted by a person's key only
                    event = action_keys.classify_action(event)  # type: ignore[arg-type]
            try:
                if trust is not None and role != "steps":  # trust is decided here, before the core
                    event = trust.classify(event, role == "verified_outcomes")
                new = apply_into(res, state, event, now, clock)
            except Exception as exc:  # a bug of ours must not stop the partition nor lose the message
                del res.transitions[:], res.notes[:], res.actions[:]  # what the failed event left: not the next one's
                log.exception("internal error on %s[%d]@%d; dead-lettered", rec.topic, rec.partition, rec.offset)
                out.deadletters.append(DeadLetter(rec, "internal_error", f"{type(exc).__name__}: {exc}"))
                counts["invalid", role, "internal_error"] += 1
                hot.taken.pop(run_id, None)  # apply may have changed it half-way: never kept decoded
                continue
            # _take, inline (the lists are this task's Result's: emptied for the next event)
            notes, transitions = res.notes, res.transitions
            if notes:
                for note in notes:
                    noted[note] = noted.get(note, 0) + 1
                notes.clear()
            live[run_id] = new
            if transitions:
                if res.actions:  # a recovery action comes with a transition, or from a person (below)
                    out.actions += res.actions
                    res.actions.clear()
                out.transitions += transitions
                moved.add(run_id)
            elif res.actions:  # a person's action: a record, no transition
                out.actions += res.actions
                res.actions.clear()
            if event_mode and (transitions or new is not state or event.__class__ not in DEADLINE_KEEPING):
                timers.changed(new, bool(transitions))  # replay's scheduling, event by event (its first test inline)
                if heap and heap[0] <= clock:  # a deadline already past (an approval's): it fires now
                    self.fire_due(clock, out)
            transitions.clear()
        if noted:
            counts.update(noted)
        self.clock = clock
        fire = punctuate
        for rec in ticks:
            tick = decode_tick(rec)
            if tick.__class__ is DeadLetter:
                out.deadletters.append(tick)  # type: ignore[arg-type]
                out.counts["invalid", "ticks", "undecodable"] += 1
                continue
            out.counts["event", "ticks", "tick"] += 1
            if event_mode and tick.now_ms > self.clock:  # moves the event clock on event time only
                self.clock = tick.now_ms
            fire = True
        if fire and caught_up:
            self.fire_due(self.clock if event_mode else self.wall_ms(), out)
        hot.put_back(live)  # taken and left as committed (a stale timer's run): kept decoded
        self._finish(out)
        return out

    @property
    def holding(self) -> int:
        """Records held back by the last fold, waiting for the other input."""
        return self.stream.holding

    @property
    def held_bytes(self) -> int:
        return self.stream.held_bytes

    @property
    def held_topics(self) -> Collection[str]:
        """The input topics it holds records of."""
        return self.stream.held.keys()

    def fire_due(self, now_ms: int, out: Batch) -> None:
        """Fire every due timer of the partition in deadline order: O(due timers)."""
        timers, before = self.timers, self._before
        for state, health, res in timers.fire_due(now_ms):
            run_id = state.run_id
            if run_id not in before:
                before[run_id] = health
            self._take(run_id, res, out)
            if res.state is not None:
                timers.changed(res.state, bool(res.transitions), run=timers.firing)


def _ts(item) -> int:
    return item[1].ts
