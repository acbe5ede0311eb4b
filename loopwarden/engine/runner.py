"""One process's run of its engines: side by side, stopped by SIGTERM/SIGINT, cut short by a watchdog.

Every stage process (``loopwarden worker``, ``loopwarden bridge``) runs through :func:`run_engines`: the
signal handlers, the watchdog that exits ``shutdown_timeout_s`` after the signal whatever happens (a
broker that does not answer must not keep a pod terminating), its HTTP site (``/readyz`` and
``/metrics``) for as long as the engines run. Process set-up (logging, the collector) is the CLI's.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import threading
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Protocol

from loopwarden.engine.loop import Engine
from loopwarden.engine.manager import unless_stopped

log = logging.getLogger("loopwarden.worker")

EXIT_STOP_TIMEOUT = 3  # the process was told to stop and had to be cut short
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Site(Protocol):
    """What serves the process's HTTP routes (aiohttp's runner, or the guarded site)."""

    async def cleanup(self) -> None: ...


async def run_engines(engines: list[Engine], shutdown_timeout_s: float, serve: Callable[[], Awaitable[Site]],
                      before: Callable[[], Awaitable[None]] | None = None, logger: logging.Logger = log) -> None:
    """Run ``engines`` until SIGTERM/SIGINT or until one ends, with the HTTP site ``serve`` starts.

    ``before``: awaited once the site serves, before the engines start (the worker makes its topics there)."""
    loop = asyncio.get_running_loop()

    def on_signal() -> None:
        if engines[0].stopping.is_set():
            return
        logger.info("stopping (exit within %.0fs)", shutdown_timeout_s)
        watchdog = threading.Timer(shutdown_timeout_s, exit_now, args=(shutdown_timeout_s,))
        watchdog.daemon = True
        watchdog.start()
        for engine in engines:
            engine.stop()

    for sig in STOP_SIGNALS:
        loop.add_signal_handler(sig, on_signal)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)  # held by run_process until handled here
    site = await serve()
    try:
        if before is not None and not await unless_stopped(before(), engines[0].stopping):
            return  # told to stop while making the topics (a broker that does not answer): nothing to stop yet
        await run_together(engines)
    finally:
        await site.cleanup()


def run_process(main: Callable[[], Coroutine[Any, Any, None]]) -> None:
    """``asyncio.run(main())`` with the stop signals held until :func:`run_engines` handles them: a Ctrl-C
    while the event loop is being built is then the usual clean stop, not an exception inside asyncio's
    own set-up (which leaves a half-made loop and a traceback at exit)."""
    signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        asyncio.run(main())
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)


async def run_together(engines: list[Engine]) -> None:
    """Run engines side by side; the first to end (stopped, or failed) stops the others, and its error is raised."""
    runs = [asyncio.create_task(engine.run()) for engine in engines]
    done, pending = await asyncio.wait(runs, return_when=asyncio.FIRST_COMPLETED)
    for engine in engines:
        engine.stop()
    await asyncio.gather(*pending, return_exceptions=True)
    for task in done:
        task.result()


def exit_now(timeout_s: float) -> None:
    """The watchdog's end: the engines did not stop in time, the process exits without waiting for them."""
    log.critical("worker did not stop within %.0fs (broker unreachable?); exiting now", timeout_s)
    logging.shutdown()
    os._exit(EXIT_STOP_TIMEOUT)
