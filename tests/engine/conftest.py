"""The engine's tests run stages against the session's real broker, like the integration tests."""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(items):
    for item in items:
        if "tests/engine" in str(item.fspath):
            item.add_marker(pytest.mark.integration)
