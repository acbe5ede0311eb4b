"""The fault suite runs against real brokers, like the integration tests."""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(items):
    for item in items:
        if "tests/faults" in str(item.fspath):
            item.add_marker(pytest.mark.integration)
