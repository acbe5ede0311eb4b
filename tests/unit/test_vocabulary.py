"""One vocabulary: the words the rules core says are the ones loopwarden.codecs.vocabulary defines,
and the metrics, the changelog codec and the TypeScript types name the same words."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from hypothesis import HealthCheck, given, settings

from loopwarden.codecs import CAUSES, FINISH_REASONS, RECEIPT_KINDS, STATES, TOOL_STATUSES, decode_input
from loopwarden.codecs import vocabulary as v
from loopwarden.replay import Replay
from loopwarden.rules import DEFAULT_SETTINGS, apply, fire_next, next_deadline
from loopwarden.rules.codec import WORDS
from loopwarden.rules.machine import TIMER_REASONS
from loopwarden.simulate import fleet as simulated_fleet
from loopwarden.engine.metrics import EngineMetrics
from loopwarden.stages.health import metrics
from tests import strategies

REPO = Path(__file__).resolve().parents[2]
RULES = REPO / "loopwarden" / "rules"
NOTE_LABELS = {"ignored": v.IGNORED, "disagreement": v.DISAGREEMENTS, "cause": CAUSES, "reported_cause": CAUSES,
               "receipt": v.RECEIPT_OUTCOMES, "timer": v.TIMER_KINDS, "evicted": (*STATES, "NEVER_STARTED")}


def _said(events) -> list[tuple[str, str]]:
    """(what, word) for every reason, disagreement, ignored kind and note the core returns on ``events``."""
    said: list[tuple[str, str]] = []
    states: dict = {}

    def take(res) -> None:
        for kind, label in res.notes:
            said.append(("note:" + kind, label))
        for t in res.transitions:
            said.append(("reason", t.reason))
            said.extend(("disagreement", d) for d in t.evidence.disagreements)
            said.extend(("ignored", k) for k in t.evidence.ignored)

    for ev in events:
        res = apply(states.get(ev.run_id), ev, ev.ts)
        states[ev.run_id] = res.state
        take(res)
    for state in list(states.values()):  # every timer, retention and the tomb's end included
        while state is not None and (deadline := next_deadline(state, DEFAULT_SETTINGS)) is not None:
            res = fire_next(state, deadline, DEFAULT_SETTINGS)
            take(res)
            state = res.state
    return said


def _check(said) -> None:
    allowed = {"reason": v.REASONS, "disagreement": v.DISAGREEMENTS, "ignored": v.IGNORED}
    allowed.update({"note:" + k: labels for k, labels in NOTE_LABELS.items()})
    unknown = {(what, word) for what, word in said if word not in allowed[what]}
    assert not unknown, f"words the vocabulary does not define: {sorted(unknown)}"


def test_the_simulated_fleet_says_only_vocabulary_words_and_most_of_them() -> None:
    """Every scenario of the simulated fleet, timers run out: only defined words, and every reason kind appears."""
    events = [decode_input(m.value) for m in simulated_fleet(400, seed=3, bad_every=0)]
    said = _said(events)
    _check(said)
    reasons = {w for what, w in said if what == "reason"}
    assert set(v.TRANSITION_TIMERS) <= reasons and {"started", "receipt"} <= reasons


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(strategies.fleet())
def test_generated_fleets_say_only_vocabulary_words(events) -> None:
    """Runs with duplicates, gaps, wrong causes and late receipts: the core says only defined words."""
    _check(_said(events))


def _literals_passed_to(func: str) -> set[str]:
    """String constants the rules core passes to ``func(...)`` (its words, whether a fleet reaches them or not)."""
    found = set()
    for path in RULES.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) == func:
                found |= {a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)}
    return found


def test_every_word_written_in_the_rules_core_is_defined() -> None:
    """Ignored kinds (``_ignore``), disagreements (``found.append``), moves' reasons (``_move``) are vocabulary words."""
    assert _literals_passed_to("_ignore") == set(v.IGNORED)
    assert _literals_passed_to("append") >= set(v.DISAGREEMENTS)
    # tool statuses (the wire's ToolStatus) are appended too: words of the contract, not of ours
    assert _literals_passed_to("append") - set(v.DISAGREEMENTS) <= set(TOOL_STATUSES)
    moved = _literals_passed_to("_move") - set(STATES)
    assert moved <= set(v.REASONS), moved - set(v.REASONS)
    assert set(TIMER_REASONS) == set(v.TRANSITION_TIMERS)


def test_metrics_pre_create_a_series_for_every_word() -> None:
    """The metrics' label sets are the vocabulary's (untracked_step included)."""
    assert metrics.DISAGREEMENTS == v.DISAGREEMENTS and metrics.IGNORED == v.IGNORED
    assert metrics.RECEIPT_OUTCOMES == v.RECEIPT_OUTCOMES and metrics.TIMER_KINDS == v.TIMER_KINDS
    m = metrics.HealthMetrics(EngineMetrics())
    exposed = {s.labels.get("why") for fam in m.ignored.collect() for s in fam.samples}
    assert set(v.IGNORED) <= exposed


def test_the_changelog_codec_numbers_every_word() -> None:
    """Every state, cause, reason, disagreement and ignored kind has a number in WORDS (append-only)."""
    missing = {w for w in (*STATES, *CAUSES, *v.REASONS, *v.DISAGREEMENTS, *v.IGNORED) if w not in WORDS}
    assert not missing, f"append these to loopwarden.rules.codec.WORDS: {sorted(missing)}"
    assert WORDS[:10] == STATES  # numbers are part of the format: the table only grows at its end


def _ts_array(source: str, name: str) -> tuple[str, ...]:
    m = re.search(rf"export const {name} = \[(.*?)\] as const;", source, re.S)
    assert m, f"{name} not found in events.ts"
    return tuple(re.findall(r"'([^']*)'", m.group(1)))


def test_the_typescript_types_name_the_same_words() -> None:
    """events.ts's word lists equal the Python Literals (states, causes, finish reasons, reasons, …)."""
    source = (REPO / "emitters" / "ai-sdk" / "src" / "events.ts").read_text()
    pairs = {"HEALTH_STATES": STATES, "CAUSES": CAUSES, "FINISH_REASONS": FINISH_REASONS,
             "TOOL_CALL_STATUSES": TOOL_STATUSES, "RECEIPT_KINDS": RECEIPT_KINDS, "HEALTH_REASONS": v.REASONS,
             "DISAGREEMENTS": v.DISAGREEMENTS, "IGNORED_EVENTS": v.IGNORED}
    for name, words in pairs.items():
        assert _ts_array(source, name) == tuple(words), name


def test_replay_counts_only_vocabulary_notes() -> None:
    """Replay's counted notes (its summary table) use the same words."""
    r = Replay()
    for m in simulated_fleet(200, seed=5, bad_every=0):
        r.feed(decode_input(m.value))
    r.finish(advance_s=40 * 86400)
    for kind, label in r.notes:
        assert label in NOTE_LABELS[kind], (kind, label)
