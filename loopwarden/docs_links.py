"""Where each health state is explained: ``docs/states.md``, one heading per state.

The demo legend, ``loopwarden tail``, the board and ``/runs`` link a state to its line there, and
show the one-line guide below beside it. ``tests/unit/test_docs.py`` keeps this table, the
headings of docs/states.md and ``loopwarden.codecs.STATES`` equal.
"""

from __future__ import annotations

STATES_DOC = "docs/states.md"

# state -> (what it means, what the operator should do), one line each; docs/states.md says more.
STATE_GUIDE: dict[str, tuple[str, str]] = {
    "RUNNING": ("the run is making progress", "nothing yet"),
    "WAITING": ("paused for a routed human approval (owner, deadline, resume token)",
                "let the owner decide"),
    "WAITING_UNROUTED": ("paused for an approval nobody was asked for", "route the decision"),
    "STUCK": ("no progress for the inactivity timeout, a timeout, or an approval past its deadline",
              "inspect the last durable progress"),
    "BOUNDED_STOP": ("stopped by a bound (step cap, token budget, abort), not by finishing",
                     "preserve partial work"),
    "FAILED": ("a tool or the provider failed", "diagnose the tool boundary"),
    "VERIFYING": ("finished; waiting for the destination's receipt", "wait for the receipt window"),
    "VERIFIED_COMPLETE": ("finished and the destination confirmed the outcome", "nothing"),
    "FALSE_COMPLETE": ("finished, but the destination says the outcome is absent or wrong, or never confirmed it",
                       "verify the destination"),
    "UNCERTAIN": ("what the run reported and what its steps show disagree", "ask before acting"),
}


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
