"""The read API's queries over a worker's partitions: a page of ``GET /runs`` across their indexes, one run's state.

Each partition's :class:`~loopwarden.api.readmodel.RunsIndex` keeps its runs ordered; a page walks
them in order (by partition and run id, or oldest in state first across partitions by a merge), at
most ``SCAN_MAX`` entries, and reads what it shows from the committed states.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator, Mapping

from loopwarden.rules import RunState, decode_state
from loopwarden.api.readmodel import Entry, RunsIndex, entry_document

SCAN_MAX = 20_000  # index entries one page may walk (each read from the store: ~3-5 µs, decode_listing)


def committed_state(store: Mapping[bytes, bytes], run_id: str) -> RunState | None:
    """A run's committed state in its partition's store (``GET /runs/{id}``), or None."""
    raw = store.get(run_id.encode())
    return None if raw is None else decode_state(raw, run_id)


def page(indexes: Mapping[int, RunsIndex], *, state: str | None, agent: str | None, order: str,
         cursor: tuple | None, limit: int, now_ms: int, scan_max: int = SCAN_MAX) -> tuple[list[dict], tuple | None]:
    """A page of the runs of these partitions after ``cursor``, and the cursor of the next page (None: the end).

    Order ``id``: by (partition, run id), cursor ``(partition, run_id)``. Order ``age``: oldest in
    state first across all partitions, cursor ``("age", since_ts, run_id)``. At most ``scan_max``
    entries are walked: a page can be short (even empty) and still have a next cursor."""
    found: list[dict] = []
    scanned = 0
    if order == "age":
        after = (cursor[1], cursor[2]) if cursor else None
        walks = [_tagged(indexes[p].walk(state, "age", after), p) for p in sorted(indexes)]
        last = None
        for e, p in heapq.merge(*walks):
            scanned += 1
            last = e
            if agent is None or e.agent == agent:
                found.append({**entry_document(e, now_ms), "partition": p})
                if len(found) >= limit:
                    break
            if scanned >= scan_max:
                break
        else:
            return found, None
        return found, ("age", last.since_ts, last.run_id)
    for p in sorted(indexes):
        if cursor is not None and p < cursor[0]:
            continue
        after = (cursor[1],) if cursor is not None and p == cursor[0] else None
        for e in indexes[p].walk(state, "id", after):
            scanned += 1
            if agent is None or e.agent == agent:
                found.append({**entry_document(e, now_ms), "partition": p})
                if len(found) >= limit:
                    return found, (p, e.run_id)
            if scanned >= scan_max:
                return found, (p, e.run_id)
    return found, None


def _tagged(entries: Iterator[Entry], partition: int) -> Iterator[tuple[Entry, int]]:
    for e in entries:
        yield e, partition
