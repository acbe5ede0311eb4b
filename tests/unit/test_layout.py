"""The reading test of the layout, as far as a test can read: folders by role, small modules, no import cycle."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "loopwarden"
ENGINE = PACKAGE / "engine"
FOLDERS = [ENGINE, PACKAGE / "stages" / "health", PACKAGE / "stages" / "otel", PACKAGE / "api", PACKAGE / "commands"]


def _module(path: Path) -> str:
    return ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts).removesuffix(".__init__")


def _imports(path: Path) -> set[str]:
    """Modules of loopwarden that ``path`` imports at run time (not under TYPE_CHECKING)."""
    tree = ast.parse(path.read_text())
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                continue
            if isinstance(child, ast.ImportFrom) and child.module and child.module.startswith("loopwarden"):
                for a in child.names:
                    sub = f"{child.module}.{a.name}"
                    found.add(sub if (PACKAGE.parent / (sub.replace(".", "/") + ".py")).exists() else child.module)
            visit(child)

    visit(tree)
    return found


def test_no_module_of_the_engine_or_a_stage_is_much_over_300_lines() -> None:
    """Each module of the engine, the stages, the read API and the commands stays readable in one sitting."""
    folders = [d for d in FOLDERS if d.name != "otel"]  # the bridge's decoder and fold are one idea each, longer
    sizes = {str(p.relative_to(PACKAGE)): len(p.read_text().splitlines()) for d in folders for p in d.glob("*.py")}
    assert max(sizes.values()) <= 300, sorted(sizes.items(), key=lambda kv: -kv[1])[:3]


def test_the_health_tasks_fold_stays_under_300_lines() -> None:
    """task.py holds the fold only (a batch's end is batchend.py's): at most 300 lines."""
    assert len((PACKAGE / "stages" / "health" / "task.py").read_text().splitlines()) <= 300


def test_no_folder_holds_more_than_25_modules() -> None:
    """A folder a reader opens shows its role at a glance: at most 25 modules."""
    for folder in [PACKAGE, *(d for d in PACKAGE.rglob("*") if d.is_dir() and (d / "__init__.py").exists())]:
        assert len([p for p in folder.glob("*.py") if p.name != "__init__.py"]) <= 25, folder


def test_loopwarden_modules_import_no_cycle() -> None:
    """The run-time imports between the modules of the engine, the stages, the read API and the commands form no
    cycle."""
    graph = {_module(p): _imports(p) for d in FOLDERS for p in d.glob("*.py")}
    done: set[str] = set()

    def walk(node: str, path: tuple[str, ...]) -> None:
        assert node not in path, f"import cycle: {' -> '.join(path + (node,))}"
        if node in done:
            return
        for nxt in graph.get(node, ()):
            if nxt != node and not node.startswith(nxt + "."):
                walk(nxt, path + (node,))
        done.add(node)

    for module in graph:
        walk(module, ())


def test_the_engine_knows_no_stage() -> None:
    """The engine's loop and its collaborators import no stage, no rule, no read API (a new stage is a folder)."""
    outside = ("loopwarden.stages", "loopwarden.rules", "loopwarden.api", "loopwarden.commands", "loopwarden.cli")
    for path in ENGINE.glob("*.py"):
        assert not {m for m in _imports(path) if m.startswith(outside)}, path.name


def test_no_stage_imports_another() -> None:
    """A stage's modules import the engine, the rules, the read API, never another stage's folder."""
    stages = PACKAGE / "stages"
    for folder in (d for d in stages.iterdir() if (d / "__init__.py").exists()):
        others = tuple(f"loopwarden.stages.{d.name}" for d in stages.iterdir() if d.is_dir() and d != folder)
        for path in folder.glob("*.py"):
            assert not {m for m in _imports(path) if m.startswith(others)}, f"{folder.name}/{path.name}"


def test_process_set_up_happens_only_in_the_cli() -> None:
    """Logging, log filters and the collector are set by loopwarden.cli.set_up_process, never by a library function."""
    set_up = {"basicConfig", "freeze", "for_streaming", "quiet_repeats", "quiet_fence_leftovers", "_watch_startup",
              "set_threshold"}
    found = []
    for path in PACKAGE.rglob("*.py"):
        if path.name in ("cli.py", "gctune.py"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call):
                name = getattr(node.func, "attr", getattr(node.func, "id", None))
                if name in set_up:
                    found.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {name}")
    assert not found, found


def test_every_module_of_the_engine_and_the_stages_is_named_in_the_architecture_doc() -> None:
    """Each module of the engine, the stages and the read API has a docstring and is named, by its path, in
    docs/architecture.md (the walk of one batch, or the modules' roles after it)."""
    doc = (PACKAGE.parent / "docs" / "architecture.md").read_text()
    for folder in (ENGINE, PACKAGE / "stages" / "health", PACKAGE / "stages" / "otel", PACKAGE / "api"):
        for path in folder.glob("*.py"):
            if path.name == "__init__.py":
                continue
            assert ast.get_docstring(ast.parse(path.read_text())), f"{path.name} has no docstring"
            name = str(path.relative_to(PACKAGE))
            assert f"`{name}`" in doc, f"docs/architecture.md does not name {name}"
