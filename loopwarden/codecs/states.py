"""The health states, one row each: every fact about a state that is not a rule lives here.

A row gives the state's name, its stored number in the changelog codec's word table
(``loopwarden.rules.codec.WORDS``: part of the stored format, never changed or reused), the timer
the rules arm while a run is in it, whether it needs a person or is settled, its one-line meaning,
what to do, and how it is shown (the board's badge, the terminal's colour, the demo's short name).
The wire's ``State`` Literal, the rules' timer table, the board (labels, attention list, badge CSS),
``loopwarden tail``'s and the demo's colours and short names, ``loopwarden.docs_links`` and the
states tables of docs/states.md and README.md are made from these rows or checked against them by
``tests/unit/test_states.py``.

Adding a state is one row here (``word``: the next free number, ``len(WORDS)``), the rules that
reach it (``loopwarden/rules``), and what the tests then ask for: its ``## STATE`` section in
docs/states.md, its line in the README's and docs/states.md's tables and in the board's CSS, and
``HEALTH_STATES`` in ``emitters/ai-sdk/src/events.ts``.
"""

from __future__ import annotations

from msgspec import Struct


class StateFacts(Struct, frozen=True, kw_only=True):
    """What a health state means and how it is shown; the rules decide when a run enters or leaves it."""

    name: str
    word: int  # its number in the changelog's word table: explicit, so a new state renumbers nothing
    timer: str | None  # the timer kind the rules arm in this state (it moves the run on); None: retention only
    needs_person: bool  # the board's attention list: nothing happens until someone acts
    settled: bool  # nothing left to do or to wait for: the board lets it go after its settled time
    meaning: str  # one line
    do: str  # one line, imperative: what the operator does
    background: str  # the board's badge: CSS colours, text against background at least 4.5:1 (WCAG AA)
    text: str
    border: str | None  # states that need a person get a border, so colour is not the only cue
    ansi: str  # `loopwarden tail`'s SGR parameters
    short: str  # the demo's status line (at most 4 characters: ten states fit 100 columns)


STATE_TABLE: tuple[StateFacts, ...] = (
    StateFacts(name="RUNNING", word=0, timer="no_progress", needs_person=False, settled=False,
               meaning="making progress", do="nothing yet",
               background="#dbeafe", text="#0c3d7a", border=None, ansi="36", short="RUN"),
    StateFacts(name="WAITING", word=1, timer="approval_expired", needs_person=False, settled=False,
               meaning="paused for a routed approval (owner, deadline, resume token)", do="let the owner decide",
               background="#fef3c7", text="#6b4200", border=None, ansi="33", short="WAIT"),
    StateFacts(name="WAITING_UNROUTED", word=2, timer=None, needs_person=True, settled=False,
               meaning="paused for an approval nobody was asked for", do="route the decision",
               background="#fde68a", text="#5c3700", border="#8a5a00", ansi="33;1", short="UNRT"),
    StateFacts(name="STUCK", word=3, timer=None, needs_person=True, settled=False,
               meaning="no progress, a timeout, or an approval past its deadline",
               do="inspect the last durable progress",
               background="#f3e8ff", text="#5b1f8a", border="#5b1f8a", ansi="35;1", short="STCK"),
    StateFacts(name="BOUNDED_STOP", word=4, timer=None, needs_person=False, settled=True,
               meaning="stopped by a bound (step cap, token budget, abort), not by finishing",
               do="preserve partial work",
               background="#e0e7ff", text="#2c3380", border=None, ansi="34", short="BND"),
    StateFacts(name="FAILED", word=5, timer=None, needs_person=True, settled=False,
               meaning="a tool or the provider failed", do="diagnose the tool boundary",
               background="#fee2e2", text="#8a1111", border="#8a1111", ansi="31;1", short="FAIL"),
    StateFacts(name="VERIFYING", word=6, timer="receipt_window_expired", needs_person=False, settled=False,
               meaning="finished, waiting for the destination's receipt", do="wait for the receipt window",
               background="#eef1f4", text="#33404d", border=None, ansi="37", short="VRFY"),
    StateFacts(name="VERIFIED_COMPLETE", word=7, timer=None, needs_person=False, settled=True,
               meaning="finished, and the destination confirmed it", do="nothing",
               background="#dcfce7", text="#14532d", border=None, ansi="32;1", short="OK"),
    StateFacts(name="FALSE_COMPLETE", word=8, timer=None, needs_person=True, settled=False,
               meaning="finished, but the outcome is absent, wrong or never confirmed", do="verify the destination",
               background="#ffe4e6", text="#881337", border="#881337", ansi="31", short="FLS"),
    StateFacts(name="UNCERTAIN", word=9, timer=None, needs_person=True, settled=False,
               meaning="what the run reported and what its steps show disagree", do="ask before acting",
               background="#fae8ff", text="#6b1a73", border="#6b1a73", ansi="35", short="UNC"),
)

STATE_NAMES: tuple[str, ...] = tuple(s.name for s in STATE_TABLE)
FACTS: dict[str, StateFacts] = {s.name: s for s in STATE_TABLE}
NEEDS_PERSON: tuple[str, ...] = tuple(s.name for s in STATE_TABLE if s.needs_person)
SETTLED: tuple[str, ...] = tuple(s.name for s in STATE_TABLE if s.settled)
# state -> the timer kind the rules arm in it; the states not here keep a run only until retention drops it.
STATE_TIMERS: dict[str, str] = {s.name: s.timer for s in STATE_TABLE if s.timer is not None}


def css_rule(s: StateFacts) -> str:
    """The board's badge rule for the state (``loopwarden/api/board/static/board.css`` holds one per state)."""
    border = f" border-color: {s.border};" if s.border else ""
    return f".s-{s.name} {{ background: {s.background}; color: {s.text};{border} }}"


def markdown_row(s: StateFacts, doc: str = "") -> str:
    """The state's row in a markdown states table; ``doc`` is the path to docs/states.md ('' on that page)."""
    return f"| [{s.name}]({doc}#{s.name.lower()}) | {s.meaning} | {s.do} |"
