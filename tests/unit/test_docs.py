"""The docs stay in step with the code: the contract with the Structs, the states page with the state
set, docs/configuration.md with Config, and nothing outside the repository is needed."""

from __future__ import annotations

import inspect
import re
import subprocess
import typing
from pathlib import Path

import msgspec
import pytest

from loopwarden.codecs import STATES
from loopwarden.codecs import events as ev

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"
PLANNED = "*(planned)*"


def _sections(text: str) -> list[tuple[str, str]]:
    """(heading line, body up to the next heading) of a markdown page."""
    parts = re.split(r"^(#{1,6} .*)$", text, flags=re.M)
    return [(parts[i].strip(), parts[i + 1]) for i in range(1, len(parts) - 1, 2)]


def _rows(body: str) -> list[list[str]]:
    """The data rows of the first table in ``body``, as lists of cells."""
    rows = []
    for line in body.splitlines():
        if line.startswith("|") and not re.match(r"^\|[-| ]+\|$", line):
            rows.append([c.strip() for c in line.strip().strip("|").split("|")])
    return rows[1:]  # the header row


def _names(cell: str) -> list[str]:
    return re.findall(r"`([^`]+)`", cell.split("(")[0] if "(planned)" not in cell else cell.split("*(planned)*")[0])


def _structs() -> dict[str, type]:
    """Every public Struct of the codecs module, by the name the contract uses for it."""
    out = {}
    for name, cls in inspect.getmembers(ev, inspect.isclass):
        if issubclass(cls, msgspec.Struct) and cls.__module__ == ev.__name__ and not name.startswith("_"):
            out[name] = cls
    return out


def _is_condition(cls: type) -> bool:
    return issubclass(cls, ev._Condition)  # noqa: SLF001 - our own module's base


def _documented_fields(contract: str) -> tuple[dict[str, set[str]], dict[str, set[str]], dict[str, set[str]]]:
    """heading name -> documented field names, heading name -> planned field names, and the Condition
    table's kind -> fields."""
    fields_of: dict[str, set[str]] = {}
    planned_of: dict[str, set[str]] = {}
    conditions: dict[str, set[str]] = {}
    for heading, body in _sections(contract):
        m = re.match(r"^#{3,4} `?([A-Za-z_]+)`?( \*\(planned\)\*)?$", heading)
        if not m:
            continue
        name, planned = m.group(1), bool(m.group(2))
        if name == "Condition":
            for row in _rows(body):
                conditions[_names(row[0])[0]] = set(re.findall(r"`([a-z_]+)`", row[1].split("(")[0]))
            continue
        if planned:
            planned_of[name] = set()
            continue
        documented, later = set(), set()
        for row in _rows(body):
            cells = _names(row[0])
            (later if PLANNED in row[0] else documented).update(cells)
        fields_of[name] = documented
        planned_of[name] = later
    return fields_of, planned_of, conditions


def test_the_contract_names_every_struct_field_and_nothing_else() -> None:
    """docs/contract.md has a table per event type and nested record with exactly the Structs' fields;
    parts marked (planned) are not in the Structs yet (remove the mark when they land)."""
    contract = (DOCS / "contract.md").read_text()
    fields_of, planned_of, conditions = _documented_fields(contract)
    seen = set()
    for name, cls in _structs().items():
        real = {f.name for f in msgspec.structs.fields(cls)}
        config = cls.__struct_config__
        if _is_condition(cls):
            assert config.tag in conditions, f"condition kind {config.tag!r} ({name}) is not in contract.md's Condition table"
            assert conditions[config.tag] == real, (config.tag, real, conditions[config.tag])
            seen.add(config.tag)
            continue
        key = config.tag if config.tag_field == "type" else name
        assert key in fields_of, f"{name}: contract.md has no '### `{key}`' / '#### {key}' table"
        documented = fields_of[key] - ({"type"} if config.tag_field == "type" else set())
        assert documented == real, f"{key}: in the Structs only {real - documented}, in contract.md only {documented - real}"
        landed = planned_of.get(key, set()) & real
        assert not landed, f"{key}: {landed} are in the Structs now: drop their (planned) mark in contract.md"
        seen.add(key)
    extra = (set(fields_of) | set(conditions)) - seen
    assert not extra, f"contract.md documents {extra}, which are not Structs"
    for name in planned_of:
        if name not in fields_of:  # a whole planned heading
            tags = {c.__struct_config__.tag for c in _structs().values()}
            assert name not in tags and name not in _structs(), \
                f"{name} is in the Structs now: drop its (planned) mark in contract.md and give it its table"


def test_the_contract_lists_every_value_of_every_value_set() -> None:
    """Each Literal of the codecs (finish reason, tool status, cause, state…) is a row of contract.md's
    value sets with exactly its values; planned values are not in the Literal yet."""
    contract = (DOCS / "contract.md").read_text()
    body = contract.split("## Value sets", 1)[1]
    rows = {row[0]: row[1] for row in _rows(body)}
    literals = {name: alias for name, alias in vars(ev).items()
                if typing.get_origin(alias) is typing.Literal and not name.startswith("_")}
    assert literals, "no Literal value sets found in loopwarden.codecs.events"
    for name, alias in literals.items():
        label = re.sub(r"(?<!^)([A-Z])", r" \1", name).lower()
        assert label in rows, f"contract.md's value sets have no row {label!r} ({name})"
        now, _, later = rows[label].partition("planned:")
        assert re.findall(r"`([^`]+)`", now) == list(typing.get_args(alias)), label
        landed = set(re.findall(r"`([^`]+)`", later)) & set(typing.get_args(alias))
        assert not landed, f"{label}: {landed} are in the Structs now: move them out of 'planned:'"
    assert set(rows) == {re.sub(r"(?<!^)([A-Z])", r" \1", n).lower() for n in literals}


def test_every_state_has_its_heading_and_its_guide() -> None:
    """docs/states.md has a '## STATE' heading per health state (its anchor is the lower-cased name),
    each saying what it means, how a run gets there and what to do; docs_links knows the same states."""
    from loopwarden.docs_links import STATE_GUIDE, state_action, state_doc, state_doc_url

    text = (DOCS / "states.md").read_text()
    headings = [h[3:] for h, _ in _sections(text) if h.startswith("## ")]
    assert headings == list(STATES)
    for heading, body in _sections(text):
        if heading.startswith("## "):
            assert "**Means:**" in body and "**Gets here:**" in body and "**Do" in body, heading
    assert list(STATE_GUIDE) == list(STATES)
    assert state_doc("WAITING_UNROUTED") == "docs/states.md#waiting_unrouted"
    assert state_doc_url("STUCK", "https://example.org/lw/") == "https://example.org/lw/docs/states.md#stuck"
    assert state_action("WAITING_UNROUTED") == "route the decision"
    for link in re.findall(r"\]\(#([a-z_]+)\)", text):
        assert link.upper() in STATES, link
    with pytest.raises(ValueError, match="unknown health state 'DONE'"):
        state_doc("DONE")


def test_configuration_doc_is_generated_and_current() -> None:
    """docs/configuration.md is what `loopwarden config-doc` prints now (run `make docs` after changing Config)."""
    from loopwarden.cli import build_parser
    from loopwarden.commands.configdoc import render

    worker = build_parser(processor=True).parse_args(["config-doc"]).worker_parser
    assert (DOCS / "configuration.md").read_text() == render(worker), "docs/configuration.md is stale: run `make docs`"


def test_the_readme_is_short_and_its_doc_links_resolve() -> None:
    """README.md fits in 10,240 bytes, and every relative link in it and in docs/ names a file of the repository."""
    readme = (REPO / "README.md").read_bytes()
    assert len(readme) <= 10_240, len(readme)
    for page in [REPO / "README.md", *DOCS.glob("*.md")]:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text()):
            if re.match(r"^[a-z]+:", target):
                continue
            path = (page.parent / target).resolve()
            assert path.exists(), f"{page.name} links to {target}, which does not exist"


def test_nothing_needs_a_directory_outside_the_repository() -> None:
    """No doc, test, product file, Makefile or emitter source refers to the shared directory that lay beside
    the development checkouts (a public clone does not have it)."""
    paths = ["README.md", "docs", "tests", "loopwarden", "Makefile", "emitters/ai-sdk/src", "emitters/ai-sdk/test",
             "dev", "bench"]
    shared = "shared"  # spelt apart so that this file does not match its own pattern
    proc = subprocess.run(["grep", "-rIln", "--exclude-dir=node_modules", rf"\.\./{shared}\|/work/{shared}", *paths],
                          cwd=REPO, capture_output=True, text=True)
    assert proc.stdout == "", proc.stdout
