"""Owning a partition again after its transaction failed or was fenced, beside the loop: the others go on meanwhile.

A partition dropped by a failure (:meth:`PartitionManager.failed`, ``fenced``) is owned again at its
``recover_at``. Owning fences its earlier producers and restores its store from the changelog: with the
memory store, every run of the partition is read again (seconds for a few hundred thousand runs). Done
inline in the loop, under the engine's lock, that stopped every other partition of the worker for as long.
Here each retry is a task of its own: the fencing and the restore run with a restorer consumer of its own
(the engine's is the rebalances'), outside the lock, while the loop polls, folds and commits the other
partitions; only the seek to the committed offsets and the hand-over take the lock
(:meth:`PartitionManager.install`), as a rebalance's owning does. A rebalance, shutdown or the layout guard's
hold cancels the retries under way before it gives up or holds any partition (:meth:`cancel`), so a retry never
installs behind them nor fences a producer of the next owner.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

from loopwarden.engine.manager import RECOVERABLE, quietly
from loopwarden.engine.recovery import restoring_consumer

if TYPE_CHECKING:
    from loopwarden.engine.config import EngineConfig
    from loopwarden.engine.manager import PartitionManager
    from loopwarden.engine.partition import AssignedPartition

log = logging.getLogger("loopwarden.worker")

BACKOFF_MAX_S = 30.0  # a retry that fails waits 1 s more than its last wait, up to this


class Reowning:
    """The retries of owning under way: partition -> its task (at most one a partition)."""

    def __init__(self, config: EngineConfig, partitions: PartitionManager, lock: asyncio.Lock, stopping: asyncio.Event,
                 restorer=restoring_consumer) -> None:
        self.config, self.partitions = config, partitions
        self.lock = lock  # the engine's: owning takes turns with rebalances and handing out batches
        self.stopping = stopping  # the engine's: set at shutdown
        self.restorer = restorer  # config -> a consumer of its own for one retry's restore (not started)
        self.tasks: dict[int, asyncio.Task] = {}

    def start_due(self) -> None:
        """Start owning again each assigned, unowned partition whose retry time has come (the loop, every turn)."""
        for p, task in list(self.tasks.items()):
            if task.done():
                del self.tasks[p]
                if not task.cancelled():
                    task.result()  # a bug of ours stops the worker, as one in a pipeline does
        if self.stopping.is_set():
            return
        now = time.monotonic()
        for p, a in sorted(self.partitions.assigned.items()):
            at = a.recover_at
            if at is None or now < at or a.owned is not None or p in self.tasks:
                continue
            a.recover_at = None  # under way: set again if it fails
            self.tasks[p] = asyncio.create_task(self._own(p, a, at), name=f"owning partition {p} again")

    async def _own(self, p: int, a: AssignedPartition, at: float) -> None:
        manager = self.partitions
        restorer = self.restorer(self.config)
        t0 = time.monotonic()
        try:
            await restorer.start()
            owning = await manager.prepare([p], restorer)  # outside the lock: the loop goes on
            installed = False
            try:
                async with self.lock:
                    # Given up meanwhile? (A rebalance or shutdown cancels this first; this is the guard.)
                    if manager.assigned.get(p) is a and a.owned is None and not self.stopping.is_set():
                        installed = True  # install's now: it lets go of it itself if it fails
                        await manager.install(owning, restorer)
            finally:
                if not installed:  # cancelled waiting for the lock, or given up
                    await owning.discard()
            if installed:
                log.info("partition %d recovered in %.2fs (the others went on meanwhile)", p, time.monotonic() - t0)
        except RECOVERABLE as exc:
            log.log(logging.WARNING if getattr(exc, "retriable", False) else logging.ERROR,  # as Engine.assign
                    "partition %d: recovery failed (%s: %s); retrying", p, type(exc).__name__, exc)
            if manager.assigned.get(p) is a:
                a.recover_at = time.monotonic() + min(BACKOFF_MAX_S, 1.0 + (time.monotonic() - at))
        finally:
            await quietly(restorer.stop(), f"stopping partition {p}'s restorer")

    async def cancel(self) -> None:
        """Stop every retry under way and wait until each has let go of what it held (producers, stores)."""
        tasks = list(self.tasks.values())
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
