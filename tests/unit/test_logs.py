"""The filters that keep a worker's log readable during a broker outage and after a fence."""

from __future__ import annotations

import asyncio
import gc
import logging

from aiokafka.errors import KafkaConnectionError, ProducerFenced

from loopwarden.commands.logs import NOISY, FencedLeftovers, RepeatFilter, quiet_repeats


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def record(msg: str, *args, name: str = "aiokafka", level: int = logging.ERROR) -> logging.LogRecord:
    return logging.LogRecord(name, level, __file__, 1, msg, args, None)


def test_the_same_message_passes_once_per_interval_and_counts_what_it_held() -> None:
    clock = Clock()
    f = RepeatFilter(every_s=10, clock=clock)
    passed = []
    for i in range(100):  # ten a second for ten seconds
        clock.t = i / 10
        r = record("Unable connect to node with id %s: %s", 1, "refused")
        if f.filter(r):
            passed.append(r.getMessage())
    clock.t = 10.0
    r = record("Unable connect to node with id %s: %s", 1, "refused")
    assert f.filter(r)
    passed.append(r.getMessage())
    assert passed == [
        "Unable connect to node with id 1: refused",
        "Unable connect to node with id 1: refused [and 99 more like it in the last 10s]",
    ]


def test_one_failure_with_errors_of_other_texts_is_one_message() -> None:
    """aiokafka words a lost connection as refused or as closed depending on the moment: one outage, one line
    per interval; another node's failure is another message."""
    f = RepeatFilter(every_s=10, clock=Clock())
    template = "Unable connect to node with id %s: %s"
    assert f.filter(record(template, 1, ConnectionRefusedError(111, "Connect call failed")))
    assert not f.filter(record(template, 1, OSError("Connection at 127.0.0.1:9092 closed")))
    assert not f.filter(record(template, 1, TimeoutError()))
    assert f.filter(record(template, 2, ConnectionRefusedError(111, "Connect call failed")))
    assert f.filter(record("%s and %s", ValueError("x")))  # arguments that do not fit: the handler reports it


def test_other_messages_levels_and_loggers_pass() -> None:
    f = RepeatFilter(every_s=10, clock=Clock())
    assert f.filter(record("a"))
    assert f.filter(record("b"))
    assert f.filter(record("a", level=logging.WARNING))
    assert f.filter(record("a", name="aiokafka.conn"))
    assert not f.filter(record("a"))


def test_memory_stays_bounded_with_ever_new_messages() -> None:
    f = RepeatFilter(every_s=10, clock=Clock(), max_keys=50)
    for i in range(1000):
        assert f.filter(record("offset %d", i))
    assert len(f.seen) <= 50


def test_installed_on_the_noisy_loggers() -> None:
    f = quiet_repeats()
    try:
        for name in NOISY:
            assert f in logging.getLogger(name).filters
    finally:
        for name in NOISY:
            logging.getLogger(name).removeFilter(f)


def test_a_fenced_producers_futures_never_retrieved_are_dropped_and_nothing_else() -> None:
    """asyncio's own record of a future freed with an error nobody read: dropped for ProducerFenced (aiokafka's
    leftovers of a fence the engine logs itself), kept for any other error and for any other message."""
    kept: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            kept.append(record)

    logger, handler, leftovers = logging.getLogger("asyncio"), Keep(), FencedLeftovers()
    logger.addHandler(handler)
    logger.addFilter(leftovers)
    try:
        async def leave(exc: BaseException) -> None:
            asyncio.get_running_loop().create_future().set_exception(exc)  # freed unread

        for exc in (ProducerFenced(), KafkaConnectionError("broker gone")):
            asyncio.run(leave(exc))
            gc.collect()
        logger.error("Future exception was never retrieved (said by hand)")
        fenced = ProducerFenced()
        logger.error("Task was destroyed but it is pending!", exc_info=(ProducerFenced, fenced, None))
    finally:
        logger.removeHandler(handler)
        logger.removeFilter(leftovers)
    texts = [r.getMessage().splitlines()[0] for r in kept]
    assert texts == ["Future exception was never retrieved", "Future exception was never retrieved (said by hand)",
                     "Task was destroyed but it is pending!"], texts
    assert isinstance(kept[0].exc_info[1], KafkaConnectionError)
