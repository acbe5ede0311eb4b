"""The reading test of the engine, as far as a test can read: small modules, no import cycle."""

from __future__ import annotations

import ast
from pathlib import Path

STREAMS = Path(__file__).resolve().parents[2] / "loopwarden" / "streams"


def _imports(path: Path) -> set[str]:
    """Modules of loopwarden.streams that ``path`` imports at run time (not under TYPE_CHECKING)."""
    tree = ast.parse(path.read_text())
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                continue
            if isinstance(child, ast.ImportFrom) and child.module and child.module.startswith("loopwarden.streams"):
                names = [child.module] if child.module != "loopwarden.streams" else \
                    [f"loopwarden.streams.{a.name}" for a in child.names]
                found.update(n.removeprefix("loopwarden.streams.") for n in names)
            visit(child)

    visit(tree)
    return found - {"loopwarden.streams"}


def test_no_module_of_streams_is_much_over_300_lines() -> None:
    """Each module of loopwarden/streams stays small enough to read in one sitting (~300 lines)."""
    sizes = {p.name: len(p.read_text().splitlines()) for p in STREAMS.glob("*.py")}
    assert max(sizes.values()) <= 300, sorted(sizes.items(), key=lambda kv: -kv[1])[:3]


def test_the_partition_tasks_fold_stays_under_300_lines() -> None:
    """task.py holds the fold only (a batch's end is batchend.py's): at most 300 lines."""
    assert len((STREAMS / "task.py").read_text().splitlines()) <= 300


def test_streams_modules_import_no_cycle() -> None:
    """The run-time imports between loopwarden/streams modules form no cycle."""
    graph = {p.stem: _imports(p) for p in STREAMS.glob("*.py")}
    done: set[str] = set()

    def walk(node: str, path: tuple[str, ...]) -> None:
        assert node not in path, f"import cycle: {' -> '.join(path + (node,))}"
        if node in done:
            return
        for nxt in graph.get(node, ()):
            walk(nxt, path + (node,))
        done.add(node)

    for module in graph:
        walk(module, ())


def test_the_engine_knows_no_stage() -> None:
    """The engine and its collaborators import nothing of the health stage (a new stage is a file)."""
    stage_modules = {"health", "task", "inputs", "worker", "http", "commands"}
    for name in ("engine", "manager", "partition", "checkpoint", "recovery", "alignment", "watch", "stage",
                 "deadletters"):
        assert not _imports(STREAMS / f"{name}.py") & stage_modules, name


def test_process_set_up_happens_only_in_the_cli() -> None:
    """Logging, log filters and the collector are set by loopwarden.cli.set_up_process, never by a library function."""
    set_up = {"basicConfig", "freeze", "for_streaming", "quiet_repeats", "quiet_fence_leftovers", "_watch_startup",
              "set_threshold"}
    found = []
    for path in (STREAMS.parent).rglob("*.py"):
        if path.name in ("cli.py", "gctune.py"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call):
                name = getattr(node.func, "attr", getattr(node.func, "id", None))
                if name in set_up:
                    found.append(f"{path.relative_to(STREAMS.parent.parent)}:{node.lineno} {name}")
    assert not found, found


def test_every_module_of_streams_has_its_role_in_the_architecture_doc() -> None:
    """Each module of loopwarden/streams has a docstring and a row in docs/architecture.md saying its one role."""
    doc = (STREAMS.parents[1] / "docs" / "architecture.md").read_text()
    for path in STREAMS.glob("*.py"):
        if path.name == "__init__.py":
            continue
        assert ast.get_docstring(ast.parse(path.read_text())), f"{path.name} has no docstring"
        assert f"`{path.name}`" in doc, f"docs/architecture.md does not name {path.name}"
