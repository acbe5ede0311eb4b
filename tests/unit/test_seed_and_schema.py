"""The seed's eleven cases, the JSON Schema, and the golden vectors shared with the TypeScript emitter."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

from loopwarden.codecs import decode_input, decode_transition, json_schema
from tests.conftest import REPO
from tests.vectors import make_golden

LW = [sys.executable, "-m", "loopwarden.cli"]


def _final_states(stdout: bytes) -> dict[str, str]:
    final = {}
    for line in stdout.splitlines():
        t = json.loads(line)
        final[t["run_id"]] = t["to_state"]
    return final


def test_seed_cases_reach_their_expected_states(cases_dir: Path) -> None:
    """`loopwarden replay seed-eleven.jsonl --advance-s 1800` ends each run in the expected state."""
    expected = json.loads((cases_dir / "seed-eleven.expected.json").read_text())
    proc = subprocess.run([*LW, "replay", str(cases_dir / "seed-eleven.jsonl"), "--advance-s", "1800"],
                          capture_output=True, check=True)
    assert _final_states(proc.stdout) == expected


@pytest.fixture(scope="module")
def validator() -> jsonschema.Draft202012Validator:
    schema = json.loads(subprocess.run([*LW, "schema"], capture_output=True, check=True).stdout)
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def test_schema_validates_every_seed_event(cases_dir: Path, validator) -> None:
    """`loopwarden schema` accepts every seed event."""
    for line in (cases_dir / "seed-eleven.jsonl").read_text().splitlines():
        validator.validate(json.loads(line))


def test_schema_validates_replay_output(cases_dir: Path, validator) -> None:
    """Every health_transition that replay writes validates against the schema."""
    proc = subprocess.run([*LW, "replay", str(cases_dir / "seed-eleven.jsonl"), "--advance-s", "1800"],
                          capture_output=True, check=True)
    for line in proc.stdout.splitlines():
        validator.validate(json.loads(line))


def test_schema_refuses_what_the_decoder_refuses(validator) -> None:
    """The schema carries the contract's constraints (a sample: enum, length, tag)."""
    for bad in (
        {"type": "step_finished", "run_id": "r", "ts": 1, "step": 0, "finish_reason": "done"},
        {"type": "step_finished", "run_id": "", "ts": 1, "step": 0, "finish_reason": "stop"},
        {"type": "nope", "run_id": "r", "ts": 1},
    ):
        assert not validator.is_valid(bad), bad


def test_committed_schema_is_current() -> None:
    """schema/loopwarden.schema.json (what the emitter validates against) equals `loopwarden schema`."""
    committed = json.loads((REPO / "schema" / "loopwarden.schema.json").read_text())
    assert committed == json.loads(json.dumps(json_schema())), "run: make schema"


def test_python_golden_vectors_are_current_and_valid(validator) -> None:
    """tests/vectors/python-golden.jsonl is what make_golden renders, and every line validates."""
    assert make_golden.PATH.read_bytes() == make_golden.render(), "run: python -m tests.vectors.make_golden"
    for line in make_golden.PATH.read_bytes().splitlines():
        validator.validate(json.loads(line))
        obj = json.loads(line)
        (decode_transition if obj["type"] == "health_transition" else decode_input)(line)


def test_typescript_golden_vectors_decode(validator) -> None:
    """Every event the TypeScript emitter encoded decodes in Python and validates."""
    path = REPO / "emitters" / "ai-sdk" / "test" / "vectors" / "ts-golden.jsonl"
    assert path.is_file(), f"{path} missing: the emitter package writes it (npm run vectors)"
    types = set()
    for line in path.read_bytes().splitlines():
        if not line.strip():
            continue
        validator.validate(json.loads(line))
        if json.loads(line)["type"] == "health_transition":
            types.add(decode_transition(line).__struct_config__.tag)
        else:
            types.add(decode_input(line).__struct_config__.tag)
    assert types == {"run_started", "step_finished", "run_ended", "approval_routed", "approval_resolved",
                     "segment_started", "run_active", "events_dropped", "outcome_receipt", "health_transition"}
