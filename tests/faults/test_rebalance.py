"""Rebalances under load: a second worker joins, the first is SIGKILLed, a third joins, the second leaves
with SIGTERM. Partitions move four times; timers still fire for the partitions that moved (the final
tick is consumed by whoever owns each partition then); nothing is lost, repeated or wrong."""

from __future__ import annotations

import signal
import time
from collections import Counter
from pathlib import Path

import pytest

from loopwarden.rules import TIMER_REASONS
from loopwarden.simulate import fleet
from loopwarden.engine.assignment import partition_of
from tests.faults.oracle import check, figures, wait_runs
from tests.integration.harness import PublishInBackground, make_worker, run, tick, unique_config
from tests.integration.test_processor import ADVANCE_MS, replay_final

pytestmark = pytest.mark.timeout(500)
PARTITIONS = 4


def _ready(worker, timeout_s: float = 60) -> None:
    worker.wait_ready(timeout_s)


def test_join_kill_join_leave_while_publishing(kafka, tmp_path: Path) -> None:
    config = unique_config(kafka.bootstrap, partitions=PARTITIONS)
    messages = fleet(3000, seed=43, bad_every=0)
    expected, last = replay_final(messages)
    publisher = PublishInBackground(config, messages, chunk=300, pause_s=0.5)

    kw = dict(clock="event", session_timeout_s=4.0, batch_max_records=500)
    a = make_worker(config, tmp_path, "a", **kw).start()
    workers = [a]
    try:
        publisher.start()
        time.sleep(1.5)
        b = make_worker(config, tmp_path, "b", **kw).start()   # joins: partitions move from a to b
        workers.append(b)
        time.sleep(2)
        a.stop(signal.SIGKILL)                                  # dies: its partitions move after the session
        time.sleep(2)
        c = make_worker(config, tmp_path, "c", **kw).start()   # joins
        workers.append(c)
        time.sleep(2)
        b.stop(signal.SIGTERM)                                  # leaves cleanly: everything moves to c
        assert b.proc is not None and b.proc.returncode == 0, b.log_tail()
        assert publisher.done.wait(120) and not publisher.errors, publisher.errors
        _ready(c)
        run(tick(c.config, last + ADVANCE_MS))
        ts = wait_runs(c.config, expected, timeout_s=240)
        timers = Counter(partition_of(t["run_id"].encode(), PARTITIONS) for t in ts if t["reason"] in TIMER_REASONS)
        assert set(timers) == set(range(PARTITIONS)), f"timer transitions per partition: {dict(timers)}"
        fig = figures("rebalance", "b joins, a SIGKILL, c joins, b SIGTERM (4 rebalances) while publishing",
                      ts, expected, timer_transitions_per_partition=dict(sorted(timers.items())))
        check(fig)
    finally:
        for w in workers:
            w.stop()
