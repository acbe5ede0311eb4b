"""Keep a worker's log readable while its broker is unreachable, and after a fence.

aiokafka logs every failed connection, metadata update and fetch, about ten lines a
second per worker while the broker is down (one worker left running against a dead
broker wrote 28 MB in 20 minutes). :class:`RepeatFilter` lets the same message through
once per interval and says how many copies it held back. A message is the same when
its template and its arguments are, save the errors among them: aiokafka logs one
connection failure as ``[Errno 111] Connect call failed`` or as ``Connection at ...
closed`` depending on when the broker went, and both are the one outage.

After a fence aiokafka fails the futures of the batches its sender held with ``ProducerFenced``,
some of its own that nothing reads among them, and asyncio logs each of those as an ERROR with
a traceback when it is freed ("Future exception was never retrieved"): three a fence of a
partition, beside the engine's own warning of it. :class:`FencedLeftovers` drops those.
"""

from __future__ import annotations

import logging
import time

from aiokafka.errors import ProducerFenced

# The loggers that repeat themselves during a broker outage.
NOISY = (
    "aiokafka", "aiokafka.conn", "aiokafka.consumer.fetcher", "aiokafka.consumer.group_coordinator",
    "aiokafka.producer.sender",
)


class RepeatFilter(logging.Filter):
    """Pass a (logger, level, message) at most once per ``every_s``; the next one passed says how many were held."""

    def __init__(self, every_s: float = 10.0, clock=time.monotonic, max_keys: int = 1000) -> None:
        super().__init__()
        self.every_s = every_s
        self.clock = clock
        self.max_keys = max_keys
        self.seen: dict[tuple[str, int, str], list] = {}  # key -> [last passed at, held since]

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            text = record.getMessage()
        except (TypeError, ValueError):  # a template its arguments do not fit: the handler reports it, as logging does
            return True
        key = (record.name, record.levelno, _same_text(record, text)[:300])
        now = self.clock()
        entry = self.seen.get(key)
        if entry is not None and now - entry[0] < self.every_s:
            entry[1] += 1
            return False
        if entry is not None and entry[1]:
            record.msg = f"{text} [and {entry[1]} more like it in the last {now - entry[0]:.0f}s]"
            record.args = ()
        if entry is None and len(self.seen) >= self.max_keys:
            self.seen.clear()  # messages with ever-new text: forget rather than grow
        self.seen[key] = [now, 0]
        return True


def _same_text(record: logging.LogRecord, text: str) -> str:
    """The record's message with every error among its arguments left out (``text``: as formatted, and
    returned when it has none)."""
    args = record.args
    if not isinstance(args, tuple) or not any(isinstance(a, BaseException) for a in args):
        return text
    # The template took the errors (filter() formatted it), so by %s, %r or %a: a string fits where they did.
    return str(record.msg) % tuple("<error>" if isinstance(a, BaseException) else a for a in args)


def quiet_repeats(every_s: float = 10.0) -> RepeatFilter:
    """Install one :class:`RepeatFilter` on the noisy loggers; returns it."""
    f = RepeatFilter(every_s)
    for name in NOISY:
        logging.getLogger(name).addFilter(f)
    return f


class FencedLeftovers(logging.Filter):
    """On asyncio's logger: drop "Future exception was never retrieved" of a ``ProducerFenced``, a fenced
    producer's futures nobody awaits. The fence itself is logged once by the engine, as a warning naming the
    partition, and counted (``loopwarden_transactions_total{result="fenced"}``); every other record passes."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not (isinstance(exc, ProducerFenced) and str(record.msg).startswith("Future exception was never retrieved"))


def quiet_fence_leftovers() -> FencedLeftovers:
    """Install :class:`FencedLeftovers` on asyncio's logger; returns it."""
    f = FencedLeftovers()
    logging.getLogger("asyncio").addFilter(f)
    return f
