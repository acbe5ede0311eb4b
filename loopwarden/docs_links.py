"""Where each health state is explained: ``docs/states.md``, one heading per state.

The demo legend, ``loopwarden tail``, the board and ``/runs`` link a state to its line there, and
show the one-line guide below beside it (from ``loopwarden.codecs.states``). ``tests/unit/test_docs.py``
keeps the headings of docs/states.md and the states equal.
"""

from __future__ import annotations

from loopwarden.codecs.states import STATE_TABLE

STATES_DOC = "docs/states.md"

# state -> (what it means, what the operator should do), one line each (loopwarden.codecs.states' rows);
# docs/states.md says more.
STATE_GUIDE: dict[str, tuple[str, str]] = {s.name: (s.meaning, s.do) for s in STATE_TABLE}


def state_anchor(state: str) -> str:
    """The heading anchor of ``state`` in docs/states.md (``STUCK`` -> ``stuck``)."""
    if state not in STATE_GUIDE:
        raise ValueError(f"unknown health state {state!r}; expected one of {', '.join(STATE_GUIDE)}")
    return state.lower()


def state_doc(state: str) -> str:
    """``docs/states.md#stuck``: the repository-relative link to the state's section."""
    return f"{STATES_DOC}#{state_anchor(state)}"


def state_doc_url(state: str, base: str = "") -> str:
    """The link under ``base`` (a URL or path ending in the repository root, e.g. a docs site); relative
    to the repository root when empty."""
    return (base.rstrip("/") + "/" if base else "") + state_doc(state)


def state_action(state: str) -> str:
    """What the operator should do about a run in ``state``, one line."""
    state_anchor(state)
    return STATE_GUIDE[state][1]
