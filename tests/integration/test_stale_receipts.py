"""A run id that comes back after retention, on a real broker: the first occurrence's signed receipt, re-sent
unchanged, counts for nothing in the second (docs/contract.md section 10, "One occurrence")."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from loopwarden.codecs import OutcomeReceipt, encode
from loopwarden.trust import SigningKey
from tests.integration.harness import (
    make_worker, publish, read_topic, run, tick, transitions, unique_config, wait_consumed, wait_for,
)

pytestmark = pytest.mark.timeout(240)


def _receipts_counted(worker, outcome: str) -> float:
    status, body = worker.get("/metrics", worker.config.token)
    assert status == 200, body
    return sum(s.value for family in text_string_to_metric_families(body.decode()) for s in family.samples
               if s.name == "loopwarden_receipts_total" and s.labels.get("outcome") == outcome)


def _occurrence(run_id: str, t0: int) -> list[dict]:
    return [
        {"type": "run_started", "run_id": run_id, "ts": t0, "agent": "a",
         "policy": {"version": "v1", "receipt_window_s": 600, "required_outcomes": ["file"]}},
        {"type": "step_finished", "run_id": run_id, "ts": t0 + 1000, "step": 0, "finish_reason": "stop"},
        {"type": "run_ended", "run_id": run_id, "ts": t0 + 2000, "cause": "natural_finish", "step_count": 1,
         "approval": None, "error_name": None},
    ]


def _steps(events: list[dict]) -> list[tuple]:
    return [("steps", e["run_id"].encode(), json.dumps(e).encode()) for e in events]


def test_the_worker_refuses_an_old_signed_receipt_for_a_reused_run_id_before_and_after_the_run_ends(
        kafka, tmp_path: Path) -> None:
    """The first occurrence's receipt re-sent twice to the reused run id: untrusted_stale, VERIFYING; its own verifies."""
    config = unique_config(kafka.bootstrap, partitions=2)
    key = SigningKey.generate("verifier-1")
    worker = make_worker(config, tmp_path, clock="event", retention_s=60)
    worker.extra_env = {"LOOPWARDEN_TRUSTED_VERIFIERS": key.setting}
    run_id = "reused-run"
    t0 = int(time.time() * 1000) - 3_600_000
    old = key.sign(OutcomeReceipt(run_id=run_id, ts=t0 + 3000, receipt_id="exp-1", kind="file",
                                  verifier="destination", verified=True, run_started_ts=t0))
    old_message = ("outcomes", run_id.encode(), encode(old))
    worker.start()
    try:
        run(publish(config, [*_steps(_occurrence(run_id, t0)), old_message]))

        def states(records) -> list[tuple[str, str]]:
            return [(t["to_state"], t["reason"]) for t in transitions(records) if t["run_id"] == run_id]

        first = run(read_topic(config, config.health_topic, lambda rs: ("VERIFIED_COMPLETE", "receipt") in states(rs)))
        n1 = len(states(first))  # RUNNING, maybe VERIFYING (the receipt after run_ended), VERIFIED_COMPLETE
        assert states(first)[0] == ("RUNNING", "started") and states(first)[-1] == ("VERIFIED_COMPLETE", "receipt")
        run(tick(config, t0 + 600_000))  # retention (60 s) passes: the run is dropped to its tomb
        t1 = t0 + 700_000
        second = _occurrence(run_id, t1)
        # One at a time, each once the worker consumed the last: an old receipt is stamped behind the steps'
        # stream time, so it is applied as it arrives and could overtake the run_started it must follow.
        for n, batch in ((6, _steps(second[:2])), (7, [old_message]), (8, _steps(second[2:])), (9, [old_message])):
            run(publish(config, batch))
            wait_consumed(worker, n)
        out = run(read_topic(config, config.health_topic, lambda rs: len(states(rs)) >= n1 + 2))
        time.sleep(2)  # anything the re-sent receipts would have caused has had time to come out
        out = run(read_topic(config, config.health_topic, lambda rs: len(states(rs)) > n1 + 2, timeout_s=5))
        assert states(out)[n1:] == [("RUNNING", "started"), ("VERIFYING", "natural_finish")]
        last = [t for t in transitions(out) if t["run_id"] == run_id][-1]
        assert last["seq"] == n1 + 2 and last["ts"] == t1 + 2000
        # the metrics are recorded after each batch's commit: wait for the second batch's count
        wait_for(lambda: _receipts_counted(worker, "untrusted_stale") == 2,
                 why=lambda: f"untrusted_stale counted {_receipts_counted(worker, 'untrusted_stale')}")
        fresh = key.sign(OutcomeReceipt(run_id=run_id, ts=t1 + 5000, receipt_id="exp-1", kind="file",
                                        verifier="destination", verified=True, run_started_ts=t1))
        run(publish(config, [("outcomes", run_id.encode(), encode(fresh))]))
        done = run(read_topic(config, config.health_topic, lambda rs: len(states(rs)) >= n1 + 3))
        final = [t for t in transitions(done) if t["run_id"] == run_id][-1]
        assert (final["to_state"], final["reason"], final["ts"]) == ("VERIFIED_COMPLETE", "receipt", t1 + 5000)
        assert final["evidence"]["untrusted_receipt_ids"] == ["exp-1"] and final["evidence"]["receipt_ids"] == ["exp-1"]
        assert final["evidence"]["ignored"] == {"stale_receipt": 2}
    finally:
        worker.stop()
