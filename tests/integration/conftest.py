"""Integration tests run against the session's real broker (the `kafka` fixture in tests/conftest.py)."""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(items):
    for item in items:
        if "tests/integration" in str(item.fspath):
            item.add_marker(pytest.mark.integration)
