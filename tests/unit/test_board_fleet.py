"""The runs board's fleet view (loopwarden.api.board.fleet), folded from real transitions without Kafka."""

from __future__ import annotations

import msgspec

from loopwarden.api.board.fleet import ACTIONS, ATTENTION, HOUR_MS, Fleet
from loopwarden.codecs import STATES, decode_input, encode
from loopwarden.replay import Replay
from loopwarden.simulate import fleet

START = 1_764_600_000_000


def fleet_transitions(runs: int = 60, seed: int = 5) -> list[bytes]:
    """What a worker would publish on agent.health for a simulated fleet (replay: the same rules)."""
    replay = Replay()
    out = []
    for m in fleet(runs, seed=seed, start_ms=START, bad_every=0):
        out += replay.feed(decode_input(m.value))
    out += replay.finish(3600)
    return [encode(t) for t in out]


def transition(run_id: str, seq: int, ts: int, to: str, agent: str | None = "a", frm: str | None = None) -> bytes:
    ev = {"reported_cause": None, "derived_cause": None, "fired": [], "step_count": 0, "segments": 0,
          "tool_errors": 0, "finish_reason": None, "disagreements": [], "receipt_ids": [], "approval": None}
    return msgspec.json.encode({"type": "health_transition", "run_id": run_id, "seq": seq, "ts": ts, "emitted_ts": ts,
                                "agent": agent, "policy_version": "p1", "from_state": frm, "to_state": to,
                                "reason": "r", "evidence": ev})


def test_the_board_counts_what_the_transitions_say_and_lists_the_runs_that_need_a_person() -> None:
    """Counts by state and agent equal the final states; the attention list is every run in a state
    that needs a person, oldest in state first; repeats are ignored; a run page holds every transition."""
    raws = fleet_transitions()
    board = Fleet(settled_ms=10 * HOUR_MS)
    now = START + 2 * HOUR_MS
    for raw in raws:
        board.add(raw, now)
    for raw in raws[:20]:
        assert board.add(raw, now) is None  # a repeat of (run_id, seq)
    final: dict[str, dict] = {}
    for raw in raws:
        t = msgspec.json.decode(raw)
        final[t["run_id"]] = t
    assert {s: n for s, n in board.by_state.items() if n} == \
        {s: sum(1 for t in final.values() if t["to_state"] == s) for s in {t["to_state"] for t in final.values()}}
    snap = board.snapshot(now)
    need = sorted((t["ts"], r) for r, t in final.items() if t["to_state"] in ATTENTION)
    assert [(r["since_ts"], r["run_id"]) for r in snap["attention"]] == need and need
    assert snap["attention_total"] == len(need)
    assert sum(sum(a["now"].values()) for a in snap["by_agent"]) == len(final)
    for state in (None, "FAILED", "STUCK"):
        for agent in (None, "deploy-agent", "(none)", "nobody"):
            want = [r for _ts, r in need if (state is None or final[r]["to_state"] == state)
                    and (agent is None or (final[r]["agent"] or "(none)") == agent)]
            assert [r.run_id for r in board.attention(state=state, agent=agent, limit=1000)[0]] == want
    run_id = need[0][1]
    doc = board.run_document(run_id, now)
    assert [t["seq"] for t in doc["transitions"]] == list(range(1, final[run_id]["seq"] + 1))
    assert doc["transitions"][0]["from_state"] is None and doc["action"] == ACTIONS[doc["state"]]
    assert set(ACTIONS) == set(STATES)


def test_settled_runs_age_out_and_memory_is_bounded() -> None:
    """A settled run leaves settled_ms after it settled; beyond max_runs the longest-settled go first;
    the last hour's counts forget older transitions."""
    board = Fleet(settled_ms=60_000, max_runs=100)
    board.add(transition("done", 1, START, "VERIFIED_COMPLETE"), START)
    board.add(transition("stuck", 1, START, "STUCK"), START)
    assert board.expire(START + 59_000) == 0
    assert board.expire(START + 60_000) == 1 and set(board.runs) == {"stuck"}
    for i in range(150):
        board.add(transition(f"ok-{i}", 1, START + i, "BOUNDED_STOP"), START + 61_000 + i)
    assert len(board.runs) == 100 and "stuck" in board.runs and "ok-0" not in board.runs and "ok-149" in board.runs
    assert board.hour(START + 1000)[0]["BOUNDED_STOP"] == 150
    assert board.hour(START + HOUR_MS + 120_000)[0]["BOUNDED_STOP"] == 0
    assert board.by_state["BOUNDED_STOP"] == 99 and board.by_state["STUCK"] == 1


def test_garbage_on_the_topic_is_counted_not_fatal() -> None:
    """Bytes that are not a transition are counted as ignored and change nothing."""
    board = Fleet()
    assert board.add(b"{nope", START) is None and board.add(b'{"type":"x"}', START) is None
    assert board.ignored["undecodable"] == 2 and not board.runs
