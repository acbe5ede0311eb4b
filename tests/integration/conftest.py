"""A real Apache Kafka broker (KRaft, from dev/kafka) for the whole session, on a free port."""

from __future__ import annotations

import pytest

from loopwarden.localkafka import LocalKafka


@pytest.fixture(scope="session")
def kafka(tmp_path_factory):
    broker = LocalKafka(tmp_path_factory.mktemp("kafka"), heap="768m")
    broker.start(timeout_s=120)
    yield broker
    broker.stop()


def pytest_collection_modifyitems(items):
    for item in items:
        if "tests/integration" in str(item.fspath):
            item.add_marker(pytest.mark.integration)
