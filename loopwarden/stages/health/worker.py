"""``loopwarden worker``: the health stage on the engine, its HTTP read model, stopped by SIGTERM/SIGINT.

Process set-up (logging, log filters, the garbage collector) is the CLI's
(``loopwarden.cli.main``); this module sets none of it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import threading
from collections.abc import Callable

from loopwarden.api import pages
from loopwarden.engine.assignment import partition_of
from loopwarden.engine.config import Config
from loopwarden.engine.loop import Engine
from loopwarden.stages.health.stage import HealthStage
from loopwarden.engine.metrics import Metrics
from loopwarden.stages.health.task import PartitionTask
from loopwarden.engine.topics import ensure_topics

log = logging.getLogger("loopwarden.worker")

EXIT_STOP_TIMEOUT = 3  # the worker was told to stop and had to be cut short


class Worker(Engine):
    """The engine running the health stage, and the read model ``loopwarden.api.http`` serves."""

    def __init__(self, config: Config, metrics: Metrics | None = None,
                 on_recovered: Callable[[], None] | None = None, verifiers=None) -> None:
        # verifiers: loopwarden.trust.TrustedVerifiers (LOOPWARDEN_TRUSTED_VERIFIERS), or None: every receipt counts
        metrics = metrics or Metrics()
        super().__init__(config, HealthStage(config, metrics, verifiers), metrics, on_recovered)

    @property
    def tasks(self) -> dict[int, PartitionTask]:
        return {p: part.task for p, part in self.owned_partitions().items()}  # type: ignore[misc]

    @property
    def stalled(self) -> set[int]:
        return {p for p, a in self.assigned.items() if a.stalled}

    # -- read model (loopwarden.api.http) ---------------------------------------------
    def owned(self) -> list[int]:
        return sorted(self.owned_partitions())

    def partition_of(self, run_id: str) -> int:
        return partition_of(run_id.encode(), self.config.partitions)

    def owner_url(self, partition: int) -> str | None:
        return self.assignor.owners.get(partition)

    def run_state(self, run_id: str):
        """The run's committed state, if this worker owns its partition and holds it."""
        task = self.tasks.get(self.partition_of(run_id))
        state = None if task is None else pages.committed_state(task.store, run_id)
        return None if state is None or state.tomb else state  # a tomb is a dropped run: not held

    def is_ready(self) -> bool:
        """The assignment is recovered, no partition is stalled and the topic layout lets it process."""
        return self.ready and not self.stalled and self.blocked is None

    def runs_page(self, **query) -> tuple[list[dict], tuple | None]:
        """A page of the runs this worker holds (see :func:`loopwarden.api.pages.page`)."""
        return pages.page({p: task.index for p, task in self.tasks.items()}, **query)


def run_worker(config: Config, on_recovered: Callable[[], None] | None = None, verifiers=None,
               otel: bool = False) -> int:
    """Run one worker until SIGTERM/SIGINT; exit by ``shutdown_timeout_s`` after the signal whatever happens.

    ``verifiers``: loopwarden.trust.TrustedVerifiers, or None (every receipt counts). ``otel``: the
    OpenTelemetry bridge runs in the same process, as its own engine (its own group; metrics shared)."""

    async def main() -> None:
        metrics = Metrics()
        worker = Worker(config, metrics, on_recovered=on_recovered, verifiers=verifiers)
        engines: list[Engine] = [worker]
        if otel:
            from loopwarden.stages.otel.stage import BridgeStage, bridge_config

            bridge = bridge_config(config)
            engines.append(Engine(bridge, BridgeStage(bridge, metrics), metrics, on_recovered))
        from loopwarden.api.http import serve

        loop = asyncio.get_running_loop()

        def on_signal() -> None:
            if worker.stopping.is_set():
                return
            log.info("stopping (exit within %.0fs)", config.shutdown_timeout_s)
            watchdog = threading.Timer(config.shutdown_timeout_s, _exit_now, args=(config.shutdown_timeout_s,))
            watchdog.daemon = True
            watchdog.start()
            for engine in engines:
                engine.stop()

        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, on_signal)
        runner = await serve(worker)
        try:
            if otel:
                # The bridge's stage refuses to start without agent.steps, which the worker's creates: on a
                # fresh cluster the two engines would race, so the worker's topics are made first.
                await ensure_topics(config)
            await run_together(engines)
        finally:
            await runner.cleanup()

    asyncio.run(main())
    return 0


async def run_together(engines: list[Engine]) -> None:
    """Run engines side by side; the first to end (stopped, or failed) stops the others, and its error is raised."""
    runs = [asyncio.create_task(engine.run()) for engine in engines]
    done, pending = await asyncio.wait(runs, return_when=asyncio.FIRST_COMPLETED)
    for engine in engines:
        engine.stop()
    await asyncio.gather(*pending, return_exceptions=True)
    for task in done:
        task.result()


def _exit_now(timeout_s: float) -> None:
    log.critical("worker did not stop within %.0fs (broker unreachable?); exiting now", timeout_s)
    logging.shutdown()
    os._exit(EXIT_STOP_TIMEOUT)
