"""The code that README.md and docs/ name in backticks exists: a renamed or deleted module, class, function
or file fails here, naming the page and the name, instead of leaving the docs silently wrong."""

from __future__ import annotations

import ast
import importlib
import os
import re
from functools import cache
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
SKIP_DIRS = {".git", ".venv", ".tools", ".kafka", "node_modules", "dist", "__pycache__", ".pytest_cache",
             ".hypothesis"}
CODE_SUFFIXES = {".py", ".ts", ".mjs", ".js", ".yml", ".yaml"}
EXTENSIONS = r"py|md|yml|yaml|ts|mjs|js|json|jsonl|toml|css|html|sh|go|txt"
# Words in backticks that look like code but are not the repository's: directories `make setup` makes, a
# script of the Kafka distribution, Kafka Streams' and Faust's classes, and a verifier setting's key.
NOT_OURS = {".kafka/", ".tools/", "kafka-acls.sh", "TaskManager", "table._on_changelog_sent", "file.prefixes"}


@cache
def _files() -> tuple[str, ...]:
    """Every file and directory of the checkout, as repository-relative paths (generated trees left out)."""
    out = []
    for root, dirs, files in os.walk(REPO):
        dirs[:] = [d for d in dirs if d not in SKIP_DIRS]  # not walked at all: node_modules is large
        rel = Path(root).relative_to(REPO)
        out.extend((rel / name).as_posix() for name in (*dirs, *files))
    return tuple(out)


@cache
def _trees() -> list[tuple[Path, ast.Module]]:
    trees = []
    for rel in _files():
        if rel.endswith(".py") and rel.split("/")[0] in {"loopwarden", "tests", "bench", "dev"} and \
                REPO / rel != Path(__file__).resolve():  # this file names what does not exist, on purpose
            trees.append((REPO / rel, ast.parse((REPO / rel).read_text())))
    return trees


@cache
def _identifiers() -> frozenset[str]:
    """Every name the code defines or uses: Python's (definitions, names, attributes, imports, keywords, the
    words of its strings but not of its docstrings), and the words of the TypeScript sources and the alert
    rules (external names the code uses count: they exist)."""
    names: set[str] = set()
    for _, tree in _trees():
        docstrings = {body[0].value for node in ast.walk(tree)
                      if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                      and (body := node.body) and isinstance(body[0], ast.Expr)}
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.Name):
                names.add(node.id)
            elif isinstance(node, ast.Attribute):
                names.add(node.attr)
            elif isinstance(node, ast.alias):
                names.update(node.name.split("."))
                names.add(node.asname or "")
            elif isinstance(node, ast.keyword) and node.arg:
                names.add(node.arg)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node not in docstrings:
                words = re.findall(r"[A-Za-z_][\w.]*", node.value)  # topic names, error names
                names.update(words, *(w.split(".") for w in words))
    for rel in _files():
        if Path(rel).suffix in CODE_SUFFIXES - {".py"}:
            names.update(re.findall(r"[A-Za-z_]\w*", (REPO / rel).read_text(errors="replace")))
    return frozenset(names)


@cache
def _classes() -> dict[str, list[tuple[set[str], list[str]]]]:
    """Class name -> (attributes it defines, its bases' names), for every class of the repository's Python."""
    out: dict[str, list[tuple[set[str], list[str]]]] = {}
    for _, tree in _trees():
        for node in ast.walk(tree):
            if not isinstance(node, ast.ClassDef):
                continue
            attrs: set[str] = set()
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    attrs.add(item.name)
                elif isinstance(item, ast.Assign):
                    attrs.update(t.id for t in item.targets if isinstance(t, ast.Name))
                elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                    attrs.add(item.target.id)
            for sub in ast.walk(node):  # self.x = ... in its methods
                if isinstance(sub, ast.Attribute) and isinstance(sub.ctx, ast.Store) and \
                        isinstance(sub.value, ast.Name) and sub.value.id == "self":
                    attrs.add(sub.attr)
            bases = [b.id if isinstance(b, ast.Name) else b.attr for b in node.bases
                     if isinstance(b, (ast.Name, ast.Attribute))]
            out.setdefault(node.name, []).append((attrs, bases))
    return out


def _class_has(cls: str, attr: str, seen: frozenset[str] = frozenset()) -> bool:
    for attrs, bases in _classes().get(cls, []):
        if attr in attrs or any(b not in seen and _class_has(b, attr, seen | {cls}) for b in bases):
            return True
    return False


@cache
def _module_names() -> dict[str, set[str]]:
    """A loopwarden module's last name (``alignment``) -> the names defined or imported at its top level."""
    out: dict[str, set[str]] = {}
    for path, tree in _trees():
        rel = path.relative_to(REPO)
        if rel.parts[0] != "loopwarden":
            continue
        defined = out.setdefault(rel.parent.name if rel.name == "__init__.py" else rel.stem, set())
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                defined.add(node.name)
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                defined.update(t.id for t in targets if isinstance(t, ast.Name))
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                defined.update((a.asname or a.name).split(".")[0] for a in node.names)
    return out


def _path_exists(name: str, page: Path) -> bool:
    name = name.rstrip("/").split("::")[0].split("#")[0]
    files = _files()
    if name in files or (page.parent / name).exists() or f"loopwarden/{name}" in files:
        return True
    return any(f.endswith("/" + name) for f in files)  # cited from where its package or page stands


def _resolve_dotted(name: str) -> bool:
    parts = name.split(".")
    for i in range(len(parts), 0, -1):  # the longest importable module, then attributes
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ModuleNotFoundError:
            continue
        for attr in parts[i:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


def unresolved(name: str, page: Path) -> str | None:
    """Why ``name`` (a span in backticks on ``page``) names no code of the repository, or None (it does, or it
    is not a name of code)."""
    name = name.strip()
    if name in NOT_OURS or " " in name or "*" in name or name.startswith(("/", "http", "$", "-")):
        return None
    top = {f for f in _files() if "/" not in f} | set(_module_names())
    if re.fullmatch(rf"[\w./-]+\.({EXTENSIONS})(::\w+)?", name) or ("/" in name and name.split("/")[0] in top):
        return None if _path_exists(name, page) else "no such file or directory"
    call = name.removesuffix("()")
    if re.fullmatch(r"loopwarden(\.\w+)+", call):  # a module or its attribute, or a name the code says (a topic)
        return None if _resolve_dotted(call) or call in _identifiers() else "not importable"
    m = re.fullmatch(r"([A-Z]\w*[a-z]\w*)\.(\w+)", call)
    if m:
        cls, attr = m.groups()
        if cls in _classes():
            return None if _class_has(cls, attr) else f"class {cls} has no {attr}"
        return None if cls in _identifiers() else f"no class {cls}"
    m = re.fullmatch(r"([a-z_]\w*)\.(\w+)", call)
    if m and m.group(1) in _module_names() and m.group(1) != "loopwarden":
        module, attr = m.groups()
        return None if attr in _module_names()[module] else f"module {module} has no {attr}"
    if re.fullmatch(r"[A-Z][a-z0-9]+[A-Z]\w*|[A-Z]\w*Error", name) or re.fullmatch(r"[A-Za-z_]\w*\(\)", name):
        return None if call in _identifiers() else "named nowhere in the code"
    return None


def _cited(page: Path) -> list[str]:
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.S | re.M)  # code blocks show commands
    return re.findall(r"`([^`\n]+)`", text)


def test_every_name_the_docs_cite_exists_in_the_code() -> None:
    """Each file path, loopwarden.* name, Class.attribute, module.attribute, CamelCase class and name()
    that README.md or a page of docs/ puts in backticks resolves against the checkout as it is."""
    stale = sorted({f"{page.relative_to(REPO)}: `{name}`: {why}"
                    for page in PAGES for name in _cited(page) if (why := unresolved(name, page))})
    assert not stale, "the docs name code that does not exist:\n" + "\n".join(stale)


def test_a_renamed_or_deleted_name_is_caught() -> None:
    """Names that do not exist are reported; the ones that do, and words that are not code, pass."""
    page = REPO / "docs" / "architecture.md"
    assert unresolved("loopwarden/streams/nosuchmodule.py", page) == "no such file or directory"
    assert unresolved("loopwarden.rules.no_such_function", page) == "not importable"
    assert unresolved("TimerQueue.no_such_method", page) == "class TimerQueue has no no_such_method"
    assert unresolved("NoSuchEngineClass", page) == "named nowhere in the code"
    assert unresolved("no_such_function()", page) == "named nowhere in the code"
    for name in ("loopwarden/rules/timers.py", "rules/timers.py", "timers.py", "loopwarden.rules.encode_state",
                 "TimerQueue.held", "Replay.feed()", "TimerQueue", "tests/unit", "run_ended.fired",
                 "agent.health", "inactivity_timeout_s", "application/msgpack", "--fast"):
        assert unresolved(name, page) is None, name
