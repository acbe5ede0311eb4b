"""After an expansion: a moved run's records meet on its new partition in the order they were produced.

After ``loopwarden topics expand`` N -> M, a producer that has not refreshed its metadata yet
sends a run's records to its old partition *p* (hashed over N); the worker owning *p*
forwards them to the run's new partition *q* in its own transaction. A producer that has
refreshed sends the run's later records straight to *q*. Unchecked, those direct records
are folded before the forwarded ones produced earlier (they reach *q* first), and the run
ends in another state than replay gives (a run_ended before its last steps, a policy that
arrives after the verdict).

So during the *settling window* (``expand_window_s`` after the expansion) the task of *q*
holds back a record of a moved run (one whose key hashes to another partition over N) that
came straight from a producer until *p* has forwarded everything produced up to that
record's timestamp plus ``expand_settle_ms`` (the producers' clock skew and time in
flight), and applies the moved runs' records it releases in event-time order. Two halves,
as in :mod:`loopwarden.engine.alignment`:

- :class:`Settling` is the task's: which records are in scope, whether one may be applied
  under the last :class:`Horizon`, which old partitions it waits for;
- :class:`~loopwarden.engine.horizons.Horizons` is the engine's: it reads how far each old partition's records have been
  forwarded (the group's committed offsets there, and the timestamp of the first record
  not consumed yet) and when the records forwarded up to then are in the task's hands (the
  fold about to run has every record of *q* below *q*'s last stable offset read after them).

A record that waits is kept in the partition's store, committed with the batch (so a crash or a
rebalance loses nothing and the partition's offsets go on). A partition *p* that is not
consumed (its worker down) keeps the moved runs' direct records on *q* waiting until the
window ends; then everything is applied as it comes (docs/topics.md says so).
"""

from __future__ import annotations

import logging
from collections.abc import Collection

import msgspec

from loopwarden.engine.assignment import partition_of
from loopwarden.stages.health.batch import META_PREFIX
from loopwarden.engine.stage import DeadLetter, Horizon, Output, header

log = logging.getLogger("loopwarden.worker")
FORWARDED = "loopwarden-forwarded"  # header of a record the worker forwarded: its old partition
SETTLE_KEY = META_PREFIX + b"settling"  # the store's key of the records kept while they settle


class Held(msgspec.Struct, array_like=True, frozen=True):
    """A record kept in the store while it settles (what decoding it again needs)."""

    topic: str
    partition: int
    offset: int
    timestamp: int
    key: bytes
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...] = ()


_encode_held = msgspec.msgpack.Encoder().encode
_decode_held = msgspec.msgpack.Decoder(list[Held]).decode


class Settling:
    """The task's half: records of moved runs wait for their old partition's forwarded records.

    A record that waits is kept in the partition's store (``SETTLE_KEY``, committed with the
    batch's offsets), not held on the broker: the partition's offsets go on, so its own
    forwarding never waits for another partition's (two partitions waiting for each other
    would wait until the window ends)."""

    __slots__ = ("partition", "partitions", "previous", "until_ms", "settle_ms", "max_bytes", "horizon", "pending",
                 "needed", "stash", "_before", "done")

    def __init__(self, partition: int, partitions: int, previous: int, at_ms: int, settle_ms: int,
                 window_ms: int, max_bytes: int = 500_000) -> None:
        self.partition = partition
        self.partitions = partitions  # the count now
        self.previous = previous  # the count before the expansion
        self.until_ms = at_ms + window_ms if at_ms else 0  # 0: a layout record without its time: no settling
        self.settle_ms = settle_ms
        self.max_bytes = max_bytes  # the stash is one changelog record: past this, records stop waiting
        self.horizon: Horizon | None = None  # the last one whose forwarded records the task holds
        self.pending: Horizon | None = None  # read, waiting for the consumer to reach its ``need``
        self.needed: set[int] = set()  # old partitions the records kept wait for
        self.stash: list = []  # (role, event, record) kept, arrival order (committed: in the store)
        self._before: list = []  # the stash as committed, for a batch that fails
        self.done = False  # the window is over and nothing waits (the task drops this object once committed)

    def active(self, now_ms: int) -> bool:
        return now_ms < self.until_ms

    def old_partition(self, key: bytes) -> int | None:
        """For a record that belongs here: the partition a producer hashing over the old count sends it to,
        if another (None: not a moved run's, or not this partition's at all: placement judges it)."""
        p = partition_of(key, self.previous)
        if p == self.partition or partition_of(key, self.partitions) != self.partition:
            return None
        return p

    def ready(self, rec, p: int) -> bool:
        """Whether ``rec`` (a moved run's, old partition ``p``) may be applied: forwarded itself, or
        everything ``p`` held up to its timestamp + ``settle_ms`` was forwarded and is in hand."""
        if header(rec.headers, FORWARDED) is not None:
            return True
        h = self.horizon
        if h is None or p not in h.first:
            return False
        after = rec.timestamp + self.settle_ms
        first = h.first[p]
        return h.read_ms > after if first is None else first > after

    def release(self, arrived: list, now_ms: int, changes: dict, behind: Collection[bytes] = ()) -> list:
        """Of the records kept and ``arrived`` (this batch's moved runs'), those to apply now, in event-time
        order; the others are kept, in arrival order, the store told in ``changes``.

        A run's records are taken in event-time order up to its first that may not be applied yet (a direct
        one its old partition has not been forwarded past): that one and the run's later ones are kept, its
        earlier ones go, forwarded ones that arrived after it included. ``behind``: keys of runs with a record
        the task holds back for alignment; all their records are kept."""
        active = self.active(now_ms)
        self.done = not active  # everything is released below
        candidates = self.stash + arrived
        self._before = self.stash
        self.needed.clear()
        if not candidates:
            return []
        if active:
            runs: dict[bytes, list] = {}
            for item in candidates:
                runs.setdefault(item[2].key, []).append(item)
            ready, kept = [], set()
            for key, items in runs.items():
                p = partition_of(key, self.previous)
                if key in behind:
                    first = 0
                else:
                    items.sort(key=_ts)  # stable: a run's records of one timestamp stay in arrival order
                    first = next((i for i, item in enumerate(items) if not self.ready(item[2], p)), len(items))
                if first < len(items):
                    kept.update(map(id, items[first:]))
                    self.needed.add(p)
                ready += items[:first]
            keep = [item for item in candidates if id(item) in kept] if kept else []
        else:
            ready, keep = candidates, []
        if len(keep) != len(self.stash) or any(a is not b for a, b in zip(keep, self.stash)):
            raw = _encode_held([_held(item[2]) for item in keep]) if keep else None
            if raw is not None and len(raw) > self.max_bytes:  # more than one changelog record holds: stop waiting
                log.warning("partition %d: %d records of moved runs waited for their old partitions' forwarded "
                            "records (%d bytes); applying them as they came", self.partition, len(keep), len(raw))
                ready, keep, raw = ready + keep, [], None
            if raw is not None or self.stash:
                changes[SETTLE_KEY] = raw
        self.stash = keep
        ready.sort(key=_ts)  # stable: a run's records of one timestamp stay in arrival order
        return ready

    def divert(self, inputs: dict[str, list], now_ms: int, out, held: dict[str, list] | None = None) -> list:
        """Take the moved runs' records out of ``inputs`` (role -> decoded items, as ``StreamTime.ready`` gives
        them) and :meth:`release`: the records to apply now (kept before, or of this batch), in event-time
        order, counted in ``out`` (a HealthFolded) as the task counts the others; called once per fold.

        ``held``: what stream-time alignment holds back after this fold (``StreamTime.held``). A moved run
        with a record there keeps its others waiting: the horizon may count that record as in hand (it was
        in the batch), yet it is applied by a later fold, and it may be a forwarded one produced earlier."""
        arrived: list = []
        for role, items in inputs.items():
            keep = [item for item in items if self.old_partition(item[2].key) is None]
            if len(keep) != len(items):
                arrived += [item for item in items if self.old_partition(item[2].key) is not None]
                inputs[role] = keep
        behind = {item[2].key for items in held.values() for _rec, item in items
                  if item.__class__ is tuple and self.old_partition(item[2].key) is not None} if held else ()
        ready = self.release(arrived, now_ms, out.changes, behind)
        counts = out.counts
        for role, event, _rec in ready:
            counts["event", role, event.__struct_config__.tag] += 1
        return ready

    def discard(self) -> None:
        """The batch failed: the stash is what the store holds."""
        self.stash = self._before
        self.done = False

    def restore(self, raw: bytes, decode) -> None:
        """The stash from the store; ``decode(held)`` gives its (role, event, record) again."""
        self.stash = self._before = [decode(h) for h in _decode_held(raw)]


def settling_for(partition: int, placement, raw: bytes | None, settle: tuple[int, ...], decode) -> Settling | None:
    """A partition's settling after the expansion its placement knows of (None: none), with what it kept."""
    x = placement.expansion if placement is not None else None
    if x is None:
        return None
    s = Settling(partition, x.partitions, x.previous, x.at_ms, *settle)
    if raw is not None:
        s.restore(raw, decode)
    return s


def misplaced(placement, rec, role: str, out, forwarded: list) -> bool:
    """Whether a record of a run its partition does not hold belongs elsewhere (handled in ``out`` if so):
    ``forwarded`` to its partition (marked so that partition applies it without waiting), skipped when the
    expansion ``copied`` it, or dead-lettered ``wrong_partition``."""
    judged = placement.judge(rec.key, rec.topic, rec.offset)
    if judged is None:
        return False
    how, target = judged
    if how == "forwarded":
        headers = (*(rec.headers or ()), (FORWARDED, str(placement.partition).encode()))
        forwarded.append(Output(rec.topic, rec.key, rec.value, headers, target))
    if how == "wrong_partition":
        out.deadletters.append(DeadLetter(rec, how, placement.wrong(rec.key, rec.topic, target)))
        out.counts["invalid", role, how] += 1
    else:
        out.counts["repartitioned", how] += 1
    return True


def _held(rec) -> Held:
    return rec if isinstance(rec, Held) else Held(rec.topic, rec.partition, rec.offset, rec.timestamp, rec.key,
                                                  rec.value, tuple(rec.headers or ()))


def _ts(item) -> int:
    return item[1].ts
