"""The `make dev` screen: the status line fits 100 columns whatever is held, and the legend links every
state to docs/states.md."""

from __future__ import annotations

from dev.run import SHORT, WIDTH, legend_states, status_line
from loopwarden.codecs import STATES


def _metrics(held: dict[str, int], started: int = 123456, dead: int = 98765) -> dict[str, float]:
    m = {f'loopwarden_runs{{state="{s}"}}': float(n) for s, n in held.items()}
    m['loopwarden_events_total{topic="steps",type="run_started"}'] = float(started)  # not what the line counts
    m['loopwarden_invalid_events_total{reason="undecodable",topic="steps"}'] = float(dead)
    return m


def test_the_status_line_fits_100_columns_with_every_state_held() -> None:
    """All ten states held in the ten thousands still fit, largest first."""
    held = {s: 10_000 + i for i, s in enumerate(STATES)}
    line = status_line(_metrics(held), 300_000, 123456)
    assert len(line) <= WIDTH, (len(line), line)
    assert line.startswith("make dev: 123456/300000 runs · UNC 10009 ") and "+" in line
    assert line.endswith(" · 98765 dead letters")
    small = status_line(_metrics({"STUCK": 3, "RUNNING": 12}, started=250, dead=7), 300, 250)
    assert small == "make dev: 250/300 runs · RUN 12 STCK 3 · 7 dead letters"
    typical = status_line(_metrics({s: 10 + i for i, s in enumerate(STATES)}, started=250, dead=7), 300, 250)
    assert len(typical) <= WIDTH and "+3 more" in typical, typical  # the least held give way
    assert status_line(_metrics({}), 300, 0) == "make dev: 0/300 runs · none yet · 98765 dead letters"


def test_the_status_line_counts_the_fleets_runs_seen_and_says_one_dead_letter() -> None:
    """The line counts the fleet's runs seen, not run_started events (a run that never sent one is a run
    all the same, and the fleet has some); one dead letter is singular."""
    line = status_line(_metrics({"VERIFIED_COMPLETE": 300}, started=292, dead=1), 300, 300)
    assert line == "make dev: 300/300 runs · OK 300 · 1 dead letter"


def test_the_legend_names_each_state_with_its_short_name_action_and_link() -> None:
    """The legend has one line per state: name, the status line's short name, what to do, the doc link."""
    assert list(SHORT) == list(STATES)
    lines = legend_states(color=False).splitlines()
    assert len(lines) == len(STATES)
    for state, line in zip(STATES, lines):
        assert line.split()[:2] == [state, SHORT[state]]
        assert line.endswith(f"docs/states.md#{state.lower()}")
    assert "route the decision" in lines[STATES.index("WAITING_UNROUTED")]
