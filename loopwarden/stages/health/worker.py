"""``loopwarden worker``: the health stage on the engine, its HTTP read model, stopped by SIGTERM/SIGINT.

Process set-up (logging, log filters, the garbage collector) is the CLI's
(``loopwarden.cli.main``); this module sets none of it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from loopwarden.api import pages
from loopwarden.engine.assignment import partition_of
from loopwarden.config import Config
from loopwarden.engine.loop import Engine
from loopwarden.stages.health.stage import HealthStage
from loopwarden.engine.metrics import EngineMetrics
from loopwarden.stages.health.metrics import HealthMetrics
from loopwarden.engine.runner import run_engines, run_process
from loopwarden.stages.health.task import PartitionTask
from loopwarden.stages.topics import ensure_topics

log = logging.getLogger("loopwarden.worker")


class Worker(Engine):
    """The engine running the health stage, and the read model ``loopwarden.api.http`` serves."""

    def __init__(self, config: Config, metrics: EngineMetrics | None = None,
                 on_recovered: Callable[[], None] | None = None, verifiers=None) -> None:
        # verifiers: loopwarden.trust.TrustedVerifiers (LOOPWARDEN_TRUSTED_VERIFIERS), or None: every receipt counts
        metrics = metrics or EngineMetrics()
        super().__init__(config, HealthStage(config, HealthMetrics(metrics), verifiers), metrics, on_recovered)

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
               beside: Callable[[EngineMetrics], list[Engine]] | None = None) -> int:
    """Run one worker until SIGTERM/SIGINT; exit by ``shutdown_timeout_s`` after the signal whatever happens.

    ``verifiers``: loopwarden.trust.TrustedVerifiers, or None (every receipt counts). ``beside``: other stages'
    engines run in the same process (``worker --otel``: the OpenTelemetry bridge; its own group, metrics shared)."""

    async def main() -> None:
        metrics = EngineMetrics()
        worker = Worker(config, metrics, on_recovered=on_recovered, verifiers=verifiers)
        others = beside(metrics) if beside is not None else []
        from loopwarden.api.http import serve

        async def topics_first() -> None:
            # A stage beside (the bridge) refuses to start without agent.steps, which the worker's creates: on a
            # fresh cluster the engines would race, so the worker's topics are made first.
            await ensure_topics(config)

        await run_engines([worker, *others], config.shutdown_timeout_s, lambda: serve(worker),
                          before=topics_first if others else None)

    run_process(main)
    return 0

