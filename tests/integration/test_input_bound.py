"""What waits in a worker's memory is bounded by bytes (LOOPWARDEN_INPUT_BUFFER_MAX_BYTES), not only by count."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from loopwarden.codecs import OutcomeReceipt, Policy, RunEnded, RunStarted, StepFinished, ToolCall, encode
from loopwarden.replay import Replay
from loopwarden.config import Config
from tests.integration.harness import final_states, make_worker, publish, run, tick, unique_config, wait_consumed
from tests.integration.test_processor import ADVANCE_MS, wait_final

pytestmark = pytest.mark.timeout(300)
MIB = 1_048_576
T0 = 1_780_000_000_000


def _large_runs(runs: int, steps: int = 6, calls: int = 400) -> list:
    """Runs of large events: steps of ``calls`` tool calls (~40 KB), then after every run's steps a receipt of
    ~55 KB each, stamped later than all of them (so a worker aligning the inputs holds the receipts while the
    steps' backlog drains)."""
    policy = Policy(version="v1")
    events: list = []
    for r in range(runs):
        run_id = f"large-{r:03d}"
        events.append(RunStarted(run_id=run_id, ts=T0 + r, agent="bulk-agent", policy=policy))
        for s in range(steps):
            tool_calls = tuple(ToolCall(id=f"{run_id}-step-{s}-call-{c:04d}-{'x' * 40}", name="lookup",
                                        status="result") for c in range(calls if s < steps - 1 else 0))
            events.append(StepFinished(run_id=run_id, ts=T0 + 1000 * (s + 1) + r, step=s,
                                       finish_reason="tool-calls" if s < steps - 1 else "stop", tool_calls=tool_calls))
        events.append(RunEnded(run_id=run_id, ts=T0 + 1000 * (steps + 1) + r, cause="natural_finish",
                               step_count=steps, approval=None, error_name=None))
    late = T0 + 1000 * (steps + 2) + runs
    for r in range(runs):
        events.append(OutcomeReceipt(run_id=f"large-{r:03d}", ts=late + r, receipt_id=f"rc-{r}", kind="file",
                                     verifier="destination", verified=True,
                                     evidence={f"part-{k:02d}": "e" * 900 for k in range(60)}))
    return events


def _metric(worker, name: str, labels: dict | None = None) -> float:
    status, body = worker.get("/metrics", worker.config.token)
    assert status == 200, body
    for family in text_string_to_metric_families(body.decode()):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in (labels or {}).items()):
                return s.value
    raise AssertionError(f"{name} {labels} not in /metrics")


def test_a_backlog_of_large_events_waits_within_the_byte_bound_and_reaches_replays_states(kafka, tmp_path: Path) -> None:
    """~12 MB of 40-55 KB events pre-loaded, the bound at its least (1 MiB): the loop waits for its pipelines;
    once the receipts held for alignment fill the bound alone, their input is paused (not folded out of order)
    until the steps have caught up; what waits never passes the bound by more than one fetch (4 input
    partitions of at most ~1 MiB each); every run takes replay's path (held receipts folded as they are
    would go ahead of their runs' run_ended)."""
    config = unique_config(kafka.bootstrap, partitions=2)
    events = _large_runs(40)
    sizes = [len(encode(e)) for e in events]
    assert sum(sizes) > 10 * MIB and min(s for s in sizes if s > 10_000) > 30_000
    run(publish(config, [("outcomes" if e.__struct_config__.tag == "outcome_receipt" else "steps",
                          e.run_id.encode(), encode(e)) for e in events]))
    replay = Replay(keep_final=True)
    paths: dict[str, list[str]] = {}
    last = max(e.ts for e in events)
    for t in [t for e in sorted(events, key=lambda e: e.ts) for t in replay.feed(e)] + replay.advance_to(last + ADVANCE_MS):
        paths.setdefault(t.run_id, []).append(t.to_state)
    expected = {run_id: t.to_state for run_id, t in replay.final.items()}
    assert set(expected.values()) == {"VERIFIED_COMPLETE"}
    bound = MIB
    worker = make_worker(config, tmp_path, clock="event", input_buffer_max_bytes=bound).start()
    try:
        wait_consumed(worker, len(events), timeout_s=180)
        run(tick(worker.config, last + ADVANCE_MS))
        transitions = wait_final(worker.config, expected, timeout_s=120)
        assert final_states(transitions) == expected
        got: dict[str, list[str]] = {}
        for t in sorted(transitions, key=lambda t: (t["run_id"], t["seq"])):
            got.setdefault(t["run_id"], []).append(t["to_state"])
        assert got == paths  # the receipts after their runs' run_ended, as in replay
        then = {k: _metric(worker, "loopwarden_input_buffer_full_total", {"stage": "health", "then": k})
                for k in ("waited", "paused", "unaligned")}
        # The worker's own peak, read at every loop turn (a scrape every 50 ms saw none once on 2 cores).
        peak = _metric(worker, "loopwarden_input_waiting_peak_bytes", {"stage": "health"})
        print(f"peak waiting {peak:,.0f} B; {then}")
        assert then["waited"] >= 1 and then["paused"] >= 1 and then["unaligned"] == 0
        assert _metric(worker, "loopwarden_inputs_paused", {"stage": "health", "reason": "ahead"}) == 0
        fetch = Config().max_message_bytes + 65536  # the consumer's max_partition_fetch_bytes
        assert 0 < peak <= bound + 4 * fetch
        assert _metric(worker, "loopwarden_input_waiting_bytes", {"stage": "health"}) == 0  # nothing left waiting
    finally:
        worker.stop()


def test_the_byte_bound_is_checked_by_name() -> None:
    """A bound below 1 MiB is refused with its name and value."""
    from loopwarden.config import from_env
    from loopwarden.engine.exceptions import ConfigError

    with pytest.raises(ConfigError, match=r"input_buffer_max_bytes: 1000 must be between 1048576 and"):
        from_env(environ={"LOOPWARDEN_INPUT_BUFFER_MAX_BYTES": "1000"})
    assert from_env(environ={"LOOPWARDEN_INPUT_BUFFER_MAX_BYTES": "2097152"}).input_buffer_max_bytes == 2 * MIB
