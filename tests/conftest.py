"""Shared test helpers: where the seed cases are, and the session's Kafka broker."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


CASES = REPO / "tests" / "cases"


@pytest.fixture(scope="session")
def cases_dir() -> Path:
    """The seed's eleven cases, kept in this repository (tests/cases)."""
    assert (CASES / "seed-eleven.jsonl").is_file(), f"seed cases not found in {CASES}"
    return CASES


@pytest.fixture(scope="session")
def kafka(tmp_path_factory):
    """A real Apache Kafka broker (KRaft, from dev/kafka) for the whole session, on a free port."""
    from dev.localkafka import LocalKafka

    broker = LocalKafka(tmp_path_factory.mktemp("kafka"), heap="768m")
    broker.start(timeout_s=120)
    yield broker
    broker.stop()
