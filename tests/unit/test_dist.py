"""`make dist` builds what the README's install lines use: a wheel, and an npm tarball that ships the
emitter built (no install-time build script) and imports after a plain install."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from tests.e2e.test_ai_sdk_agents import _node

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.alone  # `make dist` rebuilds the emitter's dist/ in place, which the e2e tests import
def test_make_dist_builds_a_wheel_and_a_built_npm_tarball(tmp_path: Path) -> None:
    """The wheel holds the package (no dev/ or tests/); the tarball holds dist/*.js and types, its
    package.json builds nothing at install (its one install script checks the Node version, and ships
    in it), and `npm install <tarball>` in an empty project gives an importable @loopwarden/ai-sdk."""
    node = _node()  # puts Node 22 (and its npm) first on PATH
    proc = subprocess.run(["make", "--no-print-directory", "dist"], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    wheel = REPO / "dist" / "loopwarden-0.1.0-py3-none-any.whl"
    names = zipfile.ZipFile(wheel).namelist()
    assert "loopwarden/cli.py" in names and "loopwarden/docs_links.py" in names
    assert not [n for n in names if n.startswith(("dev/", "tests/", "bench/"))]
    tgz = REPO / "dist" / "loopwarden-ai-sdk-0.1.0.tgz"
    with tarfile.open(tgz) as tar:
        members = tar.getnames()
        manifest = json.load(tar.extractfile("package/package.json"))
    assert "package/dist/index.js" in members and "package/dist/index.d.ts" in members
    install = {k: v for k, v in manifest.get("scripts", {}).items() if k in ("prepare", "preinstall", "install", "postinstall")}
    assert install == {"preinstall": "node scripts/check-node.cjs"}
    assert "package/scripts/check-node.cjs" in members

    project = tmp_path / "app"
    project.mkdir()
    (project / "package.json").write_text('{"name": "app", "version": "1.0.0", "type": "module"}')
    npm = shutil.which("npm")
    assert npm, "npm is not on PATH: run `make node`"
    res = subprocess.run([npm, "install", "--prefer-offline", "--no-audit", "--no-fund", "--silent", str(tgz)],
                         cwd=project, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    res = subprocess.run([node, "-e", "import('@loopwarden/ai-sdk').then((m) => console.log(typeof m.createLoopwarden))"],
                         cwd=project, capture_output=True, text=True, timeout=60)
    assert res.stdout.strip() == "function", res.stderr
    target = tmp_path / "site"
    res = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(target), str(wheel)],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    res = subprocess.run([sys.executable, "-c", "import loopwarden.docs_links as d; print(d.state_doc('STUCK'))"],
                         capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(target)}, cwd=tmp_path)
    assert res.stdout.strip() == "docs/states.md#stuck", res.stderr


def _check_node(node: str, version: str) -> subprocess.CompletedProcess:
    """The emitter's install-time check run by a Node that says it is ``version``."""
    wrapper = (f"Object.defineProperty(process, 'versions', {{value: {{...process.versions, node: {version!r}}}}});"
               "require('./scripts/check-node.cjs')")
    return subprocess.run([node, "-e", wrapper], cwd=REPO / "emitters" / "ai-sdk", capture_output=True, text=True,
                          timeout=60)


def test_installing_the_emitter_on_node_20_fails_naming_both_versions() -> None:
    """`npm install` of the emitter runs its preinstall check: on Node 20 it fails with one line naming the
    Node it needs (package.json's engines) and the one found; on Node 22 it passes silently."""
    node = _node()
    old = _check_node(node, "20.11.0")
    assert old.returncode == 1
    assert old.stderr.strip() == "@loopwarden/ai-sdk needs Node >= 22 (found 20.11.0): install Node 22 or later"
    new = _check_node(node, "22.0.0")
    assert new.returncode == 0 and not new.stderr, new.stderr
