"""The repeat filter that keeps a worker's log readable during a broker outage."""

from __future__ import annotations

import logging

from loopwarden.streams.logs import NOISY, RepeatFilter, quiet_repeats


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
