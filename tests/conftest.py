"""Shared test helpers: where shared/ is, and small event builders."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def shared_dir() -> Path:
    """``../shared`` beside the checkout (CI lays it there); LOOPWARDEN_SHARED overrides."""
    return Path(os.environ.get("LOOPWARDEN_SHARED", REPO.parent / "shared")).resolve()


@pytest.fixture(scope="session")
def cases_dir() -> Path:
    path = shared_dir() / "cases"
    assert (path / "seed-eleven.jsonl").is_file(), f"seed cases not found in {path} (set LOOPWARDEN_SHARED)"
    return path


@pytest.fixture(scope="session")
def kafka(tmp_path_factory):
    """A real Apache Kafka broker (KRaft, from dev/kafka) for the whole session, on a free port."""
    from dev.localkafka import LocalKafka

    broker = LocalKafka(tmp_path_factory.mktemp("kafka"), heap="768m")
    broker.start(timeout_s=120)
    yield broker
    broker.stop()
