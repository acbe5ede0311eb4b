"""One row per health state (loopwarden.codecs.states): its stored number never moves, the rules arm the
timer it names, and the board, the terminal, the README and docs/states.md show what the row says."""

from __future__ import annotations

import json
import re
from pathlib import Path

import msgspec
import pytest

from loopwarden.api.board import fleet
from loopwarden.codecs import STATES, decode_input
from loopwarden.codecs.states import FACTS, NEEDS_PERSON, SETTLED, STATE_TABLE, css_rule, markdown_row
from loopwarden.codecs.vocabulary import TRANSITION_TIMERS
from loopwarden.docs_links import STATE_GUIDE
from loopwarden.rules import DEFAULT_SETTINGS, RunState, apply, decode_state, encode_state, fire_next, next_deadline
from loopwarden.rules.codec import _WORDS, WORDS, _numbered
from loopwarden.rules.machine import TIMER_REASONS
from loopwarden.simulate import fleet as simulated_fleet
from loopwarden.commands.clients import COLORS

REPO = Path(__file__).resolve().parents[2]
GOLDEN = json.loads((REPO / "tests" / "vectors" / "state-v2-golden.json").read_text())


def test_each_state_is_one_row_with_its_own_stored_number() -> None:
    """The wire's states are the rows, in order; each row's word number is unique and names it in WORDS."""
    assert STATES == tuple(s.name for s in STATE_TABLE)
    assert len({s.word for s in STATE_TABLE}) == len(STATE_TABLE)
    for s in STATE_TABLE:
        assert WORDS[s.word] == s.name, s.name


def test_every_word_number_given_so_far_is_kept() -> None:
    """The word table starts with every word stored so far, each at the number it was stored under."""
    assert WORDS[: len(GOLDEN["words"])] == tuple(GOLDEN["words"])


def test_todays_stored_states_still_decode() -> None:
    """Format-2 bytes written for one run in each health state decode to that state, which round-trips (fields
    added to the state since those bytes were written take their defaults)."""
    assert [g["state"]["health"] for g in GOLDEN["states"]] == list(STATES)
    for g in GOLDEN["states"]:
        data, state = bytes.fromhex(g["v2"]), msgspec.convert(g["state"], RunState, strict=False)
        assert decode_state(data, state.run_id) == state
        assert decode_state(encode_state(state), state.run_id) == state


def test_a_new_state_takes_the_next_number_and_renumbers_nothing() -> None:
    """A row numbered len(WORDS) adds one word at the end; the words appended after it come after it."""
    fixed = {s.word: s.name for s in STATE_TABLE}
    grown = _numbered({**fixed, len(WORDS): "PAUSED"}, (*_WORDS, "a_later_word"))
    assert grown == (*WORDS, "PAUSED", "a_later_word")


def test_a_state_number_that_leaves_a_gap_is_refused() -> None:
    """A row numbered past the next free number is an error naming the number to use."""
    fixed = {s.word: s.name for s in STATE_TABLE}
    with pytest.raises(ValueError, match=rf"a new state takes the next number, {len(WORDS)}"):
        _numbered({**fixed, len(WORDS) + 5: "PAUSED"}, _WORDS)


def test_the_rules_fire_the_timer_each_row_names_and_no_other() -> None:
    """On the simulated fleet run to its end, every timer transition leaves a state whose row names that
    timer, and every row's timer fires; a state without one only waits for retention."""
    states: dict = {}
    for m in simulated_fleet(400, seed=3, bad_every=0):
        ev = decode_input(m.value)
        states[ev.run_id] = apply(states.get(ev.run_id), ev, ev.ts).state
    fired = set()
    for state in states.values():
        while state is not None and (deadline := next_deadline(state, DEFAULT_SETTINGS)) is not None:
            before = state.health
            res = fire_next(state, deadline, DEFAULT_SETTINGS)
            for t in res.transitions:
                assert t.reason == FACTS[before].timer, (before, t.reason)
                fired.add((before, t.reason))
            if not res.transitions:
                assert before is None or FACTS[before].timer is None, before  # retention (None: a tomb)
            state = res.state
    assert fired == {(s.name, s.timer) for s in STATE_TABLE if s.timer is not None}
    assert {s.timer for s in STATE_TABLE} - {None} == set(TIMER_REASONS) == set(TRANSITION_TIMERS)


def test_a_state_needs_a_person_is_settled_or_has_a_timer() -> None:
    """No row both needs a person and is settled; a row with a timer is neither (the run moves on by itself);
    docs/states.md names the states that need a person."""
    for s in STATE_TABLE:
        assert [s.needs_person, s.settled, s.timer is not None].count(True) == 1, s.name
    text = (REPO / "docs" / "states.md").read_text()
    named = re.search(r"The states that need a person are \*\*(.*?)\*\*", text, re.S)
    assert named, "docs/states.md no longer says which states need a person"
    assert set(re.findall(r"[A-Z_]{4,}", named.group(1))) == set(NEEDS_PERSON)
    assert fleet.ATTENTION == NEEDS_PERSON and fleet.SETTLED == SETTLED


def _table_rows(path: Path) -> list[str]:
    return [line for line in path.read_text().splitlines() if re.match(r"^\| \[[A-Z_]+\]\(", line)]


@pytest.mark.parametrize(("page", "doc"), [("docs/states.md", ""), ("README.md", "docs/states.md")])
def test_the_states_tables_are_the_rows(page: str, doc: str) -> None:
    """docs/states.md's and the README's states tables are the rows' names, meanings and what to do."""
    want = [markdown_row(s, doc) for s in STATE_TABLE]
    assert _table_rows(REPO / page) == want, f"{page}: its states table should be:\n" + "\n".join(want)


def _luminance(colour: str) -> float:
    channels = [int(colour[i:i + 2], 16) / 255 for i in (1, 3, 5)]
    r, g, b = [c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4 for c in channels]
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


def test_the_boards_badges_are_the_rows_colours_and_readable() -> None:
    """board.css holds each row's badge rule, in order, and each badge's text is at least 4.5:1 against its
    background (WCAG AA); states that need a person have a border."""
    css = (REPO / "loopwarden" / "api" / "board" / "static" / "board.css").read_text()
    want = [css_rule(s) for s in STATE_TABLE]
    got = [line for line in css.splitlines() if line.startswith(".s-")]
    assert got == want, "board.css's state badges should be:\n" + "\n".join(want)
    for s in STATE_TABLE:
        hi, lo = sorted((_luminance(s.background), _luminance(s.text)), reverse=True)
        assert (hi + 0.05) / (lo + 0.05) >= 4.5, s.name
        assert (s.border is not None) == s.needs_person, s.name


def test_the_board_the_terminal_and_the_links_say_what_the_row_says() -> None:
    """The board's action line, tail's colour, docs_links' guide and the demo's short name (at most 4 characters,
    one per state) of a state come from its row."""
    stuck = FACTS["STUCK"]
    assert fleet.ACTIONS["STUCK"] == "Inspect the last durable progress: " + stuck.meaning + "."
    assert list(fleet.ACTIONS) == list(COLORS) == list(STATE_GUIDE) == list(STATES)
    assert COLORS["STUCK"] == stuck.ansi and STATE_GUIDE["STUCK"] == (stuck.meaning, stuck.do)
    assert all(len(s.short) <= 4 for s in STATE_TABLE) and len({s.short for s in STATE_TABLE}) == len(STATE_TABLE)
