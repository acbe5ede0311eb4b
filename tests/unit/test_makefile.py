"""`make dev` needs what the README says it needs, and nothing of the test-only tools."""

from __future__ import annotations

import re
import subprocess

from tests.conftest import REPO

# The tools the README may name for `make dev`, and the Makefile target that needs each.
TARGET_OF = {"Python 3.11": "python", "Java 17": "kafka", "Maven": "kafka", "Node.js/npm": "node", "Go": "otelcol"}


def dev_prerequisites() -> set[str]:
    match = re.search(r"^dev:([^\n=]*)$", (REPO / "Makefile").read_text(), flags=re.M)
    assert match, "no dev target in the Makefile"
    return set(match.group(1).split())


def test_make_dev_depends_on_exactly_what_the_readme_lists() -> None:
    """The README's "`make dev` needs ..." names the tools; the dev target's prerequisites are the targets
    those tools serve, no more (python: Python; kafka: Java and Maven)."""
    readme = (REPO / "README.md").read_text()
    match = re.search(r"`make dev` needs ([^;\n]+);", readme)
    assert match, "the README does not say what `make dev` needs"
    tools = re.split(r", | and ", match.group(1).strip())
    assert set(tools) <= set(TARGET_OF), tools
    assert dev_prerequisites() == {TARGET_OF[t] for t in tools}


def test_make_dev_runs_none_of_the_test_only_installs() -> None:
    """`make -n dev` plans no Go build, no npm and no apt-get: those are `make test`'s."""
    plan = subprocess.run(["make", "-n", "dev"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert plan.returncode == 0, plan.stderr
    for tool in ("go build", "npm ", "apt-get", "promtool", "chromium", "postgresql"):
        assert tool not in plan.stdout, (tool, plan.stdout)
    assert "dev.run" in plan.stdout
