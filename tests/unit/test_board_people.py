"""The board's "needs a person" list at fleet scale and what people did (loopwarden.api.board.fleet), without Kafka:
groups with counts, pages past 200, filters, finding a run, abandoned and acknowledged runs, a job's attempts."""

from __future__ import annotations

from collections import Counter

import msgspec
import pytest

from loopwarden.api.board.fleet import ATTENTION, HOUR_MS, Fleet
from loopwarden.api.board.users import parse_users
from loopwarden.codecs import encode
from loopwarden.codecs.events import RecoveryAction
from loopwarden.engine.exceptions import ConfigError
from tests.unit.test_board_fleet import START, fleet_transitions

NOW = START + 2 * HOUR_MS
FLEET_RUNS = 60_000


@pytest.fixture(scope="module")
def simulated() -> tuple[Fleet, dict[str, dict]]:
    """A simulated fleet of 60,000 runs folded onto the board, and each run's last transition."""
    raws = fleet_transitions(FLEET_RUNS, seed=43)
    board = Fleet(settled_ms=10 * HOUR_MS, max_runs=200_000)
    final: dict[str, dict] = {}
    for raw in raws:
        board.add(raw, NOW)
        t = msgspec.json.decode(raw)
        final[t["run_id"]] = t
    return board, final


def needing(final: dict[str, dict]) -> list[tuple[int, str]]:
    return sorted((t["ts"], r) for r, t in final.items() if t["to_state"] in ATTENTION)


def test_a_fleet_of_60000_runs_groups_the_runs_that_need_a_person_by_agent_state_and_reason(simulated) -> None:
    """About a third of the simulated fleet needs a person; the groups count them exactly, largest first."""
    board, final = simulated
    need = needing(final)
    assert len(final) == FLEET_RUNS and 18_000 < len(need) < 23_000
    snap = board.snapshot(NOW)
    assert snap["attention_total"] == snap["matched"] == len(need) and len(snap["attention"]) == 200
    want = Counter((final[r]["agent"] or "(none)", final[r]["to_state"], final[r]["reason"]) for _ts, r in need)
    groups, total = board.group_counts(limit=10_000)
    assert total == len(want) and {(g["agent"], g["state"], g["reason"]): g["runs"] for g in groups} == want
    assert [g["runs"] for g in groups] == sorted(want.values(), reverse=True)
    assert snap["groups"] == groups[:len(snap["groups"])]


def test_the_list_pages_past_200_rows_in_order_with_nothing_repeated_or_left_out(simulated) -> None:
    """Pages of 200 from offset 0 walk the whole list, oldest in state first; the last page is short."""
    board, final = simulated
    need = needing(final)
    seen: list[str] = []
    offset = 0
    while True:
        snap = board.snapshot(NOW, offset=offset)
        seen += [r["run_id"] for r in snap["attention"]]
        assert snap["offset"] == offset and snap["matched"] == len(need)
        if len(snap["attention"]) < 200:
            break
        offset += 200
    assert seen == [r for _ts, r in need] and offset // 200 > 100


def test_every_filter_of_state_agent_and_reason_is_one_ordered_list_with_its_count(simulated) -> None:
    """A group's filter lists exactly its runs, in order, with the group's count; paged the same way."""
    board, final = simulated
    need = needing(final)
    biggest = board.group_counts()[0][0]
    for state, agent, reason in ((biggest["state"], biggest["agent"], biggest["reason"]), ("STUCK", None, None),
                                 (None, biggest["agent"], None), (None, None, biggest["reason"])):
        want = [r for _ts, r in need if (state is None or final[r]["to_state"] == state)
                and (agent is None or (final[r]["agent"] or "(none)") == agent)
                and (reason is None or final[r]["reason"] == reason)]
        rows, matched = board.attention(state=state, agent=agent, reason=reason, limit=1000)
        assert matched == len(want) and [r.run_id for r in rows] == want[:1000]
        second, _ = board.attention(state=state, agent=agent, reason=reason, offset=200, limit=200)
        assert [r.run_id for r in second] == want[200:400]
        assert board.matching(state=state, agent=agent, reason=reason) == want
    assert board.attention(state="STUCK", agent="nobody") == ([], 0)


def test_a_run_is_found_by_its_id_or_the_start_of_it(simulated) -> None:
    """The exact id is found alone; a prefix finds the ids starting with it; an unknown id finds nothing."""
    board, final = simulated
    run_id = sorted(final)[123]
    assert board.find(run_id) == [run_id]
    prefix = run_id[:-1]
    found = board.find(prefix, limit=20)
    assert found and all(r.startswith(prefix) for r in found) and len(found) <= 20
    assert board.find("no-such-run") == []


def transition(run_id: str, seq: int, ts: int, to: str, *, frm: str | None = None, agent: str = "invoice-agent",
               reason: str = "inactivity_timeout", job: str | None = None, attempt: int | None = None) -> bytes:
    ev = {"reported_cause": None, "derived_cause": None, "fired": [], "step_count": 0, "segments": 0,
          "tool_errors": 0, "finish_reason": None, "disagreements": [], "receipt_ids": [], "approval": None}
    if job is not None:
        ev |= {"job_id": job, "attempt": attempt}
    return msgspec.json.encode({"type": "health_transition", "run_id": run_id, "seq": seq, "ts": ts, "emitted_ts": ts,
                                "agent": agent, "policy_version": "p1", "from_state": frm, "to_state": to,
                                "reason": reason, "evidence": ev})


def action(run_id: str, what: str, ts: int, *, job: str | None = None, attempt: int = 1, by: str = "person:oncall/dana",
           reason: str = "customer cancelled", action_id: str | None = None, next_attempt: int | None = None) -> bytes:
    return encode(RecoveryAction(
        action_id=action_id or f"{run_id}:op:{what}-{ts}", run_id=run_id, agent="a", job_id=job or run_id, attempt=attempt,
        next_attempt=next_attempt, action=what, reason=reason, ts=ts, not_before_ts=ts, next_policy=None,
        escalate_to=None, decided_by=by))


def test_an_abandoned_run_leaves_the_list_for_good_and_shows_under_the_closed_filter() -> None:
    """After a person's abandon the run is off the list and its group's count, listed with who and why under
    view=closed, even when the action was read before the run's transition; repeats of an action are ignored."""
    board = Fleet()
    board.add(transition("r1", 1, START, "STUCK"), NOW)
    board.add_action(action("r2", "abandon", START + 5), NOW)  # read before r2's transition (another topic)
    board.add(transition("r2", 1, START + 1, "STUCK"), NOW)
    board.add_action(action("r1", "abandon", START + 10, action_id="r1:op:x"), NOW)
    assert board.add_action(action("r1", "abandon", START + 10, action_id="r1:op:x"), NOW) is None
    snap = board.snapshot(NOW)
    assert snap["attention"] == [] and snap["attention_total"] == 0 and snap["closed_total"] == 2
    assert snap["groups"] == []
    closed = board.snapshot(NOW, closed=True)["attention"]
    assert [r["run_id"] for r in closed] == ["r1", "r2"]
    assert closed[0]["closed"] == {"action": "abandon", "decided_by": "person:oncall/dana",
                                   "reason": "customer cancelled", "ts": START + 10}
    board.add(transition("r1", 2, START + 20, "FAILED", frm="STUCK", reason="tool_error"), NOW)
    assert board.snapshot(NOW)["attention_total"] == 0  # abandoned: the job is closed
    assert board.ignored["repeat_action"] == 1


def test_an_acknowledged_run_leaves_the_list_until_its_next_transition() -> None:
    """An acknowledge takes the run off the list while it stays in that state; a later state is listed again."""
    board = Fleet()
    board.add(transition("r1", 1, START, "STUCK"), NOW)
    board.add_action(action("r1", "acknowledge", START + 10, reason="looking into it"), NOW)
    assert board.snapshot(NOW)["attention_total"] == 0 and board.snapshot(NOW, closed=True)["matched"] == 1
    board.add(transition("r1", 2, START + 20, "FAILED", frm="STUCK", reason="tool_error"), NOW)
    snap = board.snapshot(NOW)
    assert [r["run_id"] for r in snap["attention"]] == ["r1"] and snap["closed_total"] == 0
    assert snap["groups"] == [{"agent": "invoice-agent", "state": "FAILED", "reason": "tool_error", "runs": 1}]


def test_a_runs_page_lists_its_jobs_attempts_and_the_actions_decided_on_it() -> None:
    """The attempts come from the transitions' job_id and attempt; the actions, newest first, say who and why;
    the run's first transition gives its run_started ts."""
    board = Fleet()
    board.add(transition("inv-1", 1, START, "RUNNING", reason="started", job="job-9", attempt=1), NOW)
    board.add(transition("inv-1", 2, START + 300_000, "STUCK", frm="RUNNING", job="job-9", attempt=1), NOW)
    board.add_action(action("inv-1", "resume", START + 300_000, job="job-9", by="policy:p1", action_id="inv-1:2",
                            reason="STUCK:inactivity_timeout", next_attempt=2), NOW)
    board.add(transition("inv-2", 1, START + 400_000, "RUNNING", reason="started", job="job-9", attempt=2), NOW)
    board.add_action(action("inv-1", "acknowledge", START + 500_000, job="job-9", reason="attempt 2 runs"), NOW)
    doc = board.run_document("inv-1", NOW)
    assert (doc["job_id"], doc["attempt"], doc["run_started_ts"]) == ("job-9", 1, START)
    assert doc["attempts"] == [
        {"attempt": 1, "run_id": "inv-1", "state": "STUCK", "since_ts": START + 300_000},
        {"attempt": 2, "run_id": "inv-2", "state": "RUNNING", "since_ts": START + 400_000}]
    assert [(a["action"], a["decided_by"], a["reason"]) for a in doc["actions"]] == [
        ("acknowledge", "person:oncall/dana", "attempt 2 runs"), ("resume", "policy:p1", "STUCK:inactivity_timeout")]
    assert doc["needs_person"] is False and doc["closed"]["action"] == "acknowledge"
    assert board.run_document("inv-2", NOW)["attempts"] == doc["attempts"]


def test_an_undecodable_action_is_counted_and_changes_nothing() -> None:
    """Bytes that are not a recovery_action are counted as ignored; the board goes on."""
    board = Fleet()
    board.add(transition("r1", 1, START, "STUCK"), NOW)
    assert board.add_action(b'{"type":"recovery_action"}', NOW) is None and board.add_action(b"\xff", NOW) is None
    assert board.ignored["undecodable_action"] == 2 and board.snapshot(NOW)["attention_total"] == 1


def test_board_users_are_parsed_and_a_bad_entry_is_named_without_its_token() -> None:
    """NAME=TOKEN pairs map each token to its person; a malformed entry, a short or shared token is refused by name."""
    assert parse_users("dana=token-of-dana-0123456, lee = token-of-lee-01234567") == {
        "token-of-dana-0123456": "dana", "token-of-lee-01234567": "lee"}
    assert parse_users(None) == {}
    for text, message in (("dana:token-of-dana-0123456", "entry 1 is not NAME=TOKEN"),
                          ("dana=short", "the token of 'dana' must be at least 16 characters"),
                          ("dana=token-of-dana-0123456,dana=token-of-dana-6543210", "user 'dana' is given twice"),
                          ("dana=shared-token-0123456", "the token of 'dana' is another user's or LOOPWARDEN_TOKEN")):
        with pytest.raises(ConfigError) as exc:
            parse_users(text, token="shared-token-0123456")
        assert message in str(exc.value) and "token-of" not in str(exc.value).replace("token of", "")


def test_a_run_that_declared_no_job_is_its_jobs_only_attempt() -> None:
    """Without job_id in its evidence nor an action naming a job, the run's page lists it alone as attempt 1."""
    board = Fleet()
    board.add(transition("solo", 1, START, "STUCK"), NOW)
    doc = board.run_document("solo", NOW)
    assert doc["job_id"] is None and doc["attempts"] == [
        {"attempt": 1, "run_id": "solo", "state": "STUCK", "since_ts": START}]
