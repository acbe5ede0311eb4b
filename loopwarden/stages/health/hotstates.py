"""Committed run states kept decoded between a partition's batches (the health stage's fold).

A run touched by consecutive batches is then not decoded from the store each time
(``decode_state``: 4-8 µs a state; on the bench fleet 0.12 loads per event in batches of
300, 0.5 in batches of 50). A bounded, fixed cost, not per run: at most ``limit`` states
of ~1.3 KiB a partition (bench/HISTORY.md "a core": the fold in batches of 50 takes 0.74x
the time it took without them).

A fold *takes* a run's state out (apply changes states in place) and it is used only if
the store still holds the very bytes it was decoded from; :meth:`committed` puts the
batch's states back with their new bytes, and :meth:`put_back` those a fold took and left
unchanged (a timer found stale). So a state handed out is always the decoding of the
store's bytes, whatever wrote the store (a restore, a test), and an aborted batch or a
failed apply leaves nothing behind.
"""

from __future__ import annotations

from collections.abc import Mapping
from itertools import islice

from loopwarden.rules import RunState, decode_state

LIMIT = 256


class HotStates:
    """run id -> (the committed bytes, their RunState), least recently committed first."""

    __slots__ = ("limit", "entries", "taken")

    def __init__(self, limit: int = LIMIT) -> None:
        self.limit = limit
        self.entries: dict[str, tuple[bytes, RunState]] = {}
        self.taken: dict[str, tuple[bytes, RunState]] = {}  # by the fold under way

    def take(self, run_id: str, store: Mapping[bytes, bytes]) -> RunState | None:
        """The run's committed state in ``store``, to be changed (None: the store holds none)."""
        hot = self.entries.pop(run_id, None)
        raw = store.get(run_id.encode())
        if raw is None:
            return None
        if hot is None or hot[0] != raw:
            hot = (raw, decode_state(raw, run_id))
        self.taken[run_id] = hot
        return hot[1]

    def put_back(self, live: Mapping[str, RunState | None]) -> None:
        """The fold ended: what it took and did not change (not in ``live``) is kept decoded."""
        entries = self.entries
        for run_id, entry in self.taken.items():
            if run_id not in live:
                entries[run_id] = entry
        self.taken.clear()

    def committed(self, live: Mapping[str, RunState | None], changes: Mapping[bytes, bytes | None]) -> None:
        """The batch committed: its states (``live``) are the store's now, as ``changes`` encoded them."""
        entries = self.entries
        for run_id, state in live.items():
            if state is not None:
                entries[run_id] = (changes[run_id.encode()], state)  # type: ignore[assignment]
        if len(entries) > self.limit:  # the most recent half kept: a rebuild every limit / 2 commits of a run
            self.entries = dict(islice(entries.items(), len(entries) - self.limit // 2, None))

    def clear(self) -> None:
        self.entries.clear()
        self.taken.clear()

    def __len__(self) -> int:
        return len(self.entries)
