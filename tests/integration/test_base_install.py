"""The base install as a newcomer meets it: the wheel built from this checkout, installed with no extra
(msgspec only) in a fresh virtual environment, replays and prints the schema; a command that needs an
extra names it in one line."""

from __future__ import annotations

import subprocess
import sys
import venv
from pathlib import Path

import msgspec
import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.timeout(600)
PIP = [sys.executable, "-m", "pip"]


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    """A fresh venv holding the loopwarden wheel and msgspec, nothing else (installed from local files only)."""
    tmp = tmp_path_factory.mktemp("base-install")
    wheels = tmp / "wheels"
    subprocess.run([*PIP, "wheel", "--quiet", "--no-deps", "--wheel-dir", str(wheels), str(REPO)], check=True, timeout=300)
    subprocess.run([*PIP, "download", "--quiet", "--no-deps", "--only-binary=:all:", "--dest", str(wheels),
                    f"msgspec=={msgspec.__version__}"], check=True, timeout=300)
    env = tmp / "venv"
    venv.create(env, with_pip=False)
    subprocess.run([*PIP, "--python", str(env / "bin" / "python"), "install", "--quiet", "--no-index",
                    "--find-links", str(wheels), "loopwarden"], check=True, timeout=300)
    return env


def lw(env: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(env / "bin" / "loopwarden"), *args], capture_output=True, text=True, timeout=120,
                          cwd=env)


def test_the_base_install_holds_loopwarden_and_msgspec_only(base: Path) -> None:
    """Nothing of an extra came along: the venv's packages are loopwarden and msgspec."""
    res = subprocess.run([str(base / "bin" / "python"), "-c", "import importlib.metadata as m; "
                          "print(' '.join(sorted(d.metadata['Name'].lower() for d in m.distributions())))"],
                         capture_output=True, text=True, check=True, cwd=base)  # not the checkout's metadata
    assert res.stdout.split() == ["loopwarden", "msgspec"]


def test_the_base_install_replays_the_seed_cases_as_the_checkout_does(base: Path) -> None:
    """`loopwarden replay tests/cases/seed-eleven.jsonl` works with no extra, and its transitions are the
    full install's."""
    seed = str(REPO / "tests" / "cases" / "seed-eleven.jsonl")
    res = lw(base, "replay", seed, "--advance-s", "1800")
    assert res.returncode == 0, res.stderr
    full = subprocess.run([sys.executable, "-m", "loopwarden.cli", "replay", seed, "--advance-s", "1800"],
                          capture_output=True, text=True, check=True)
    assert res.stdout == full.stdout and res.stdout.count("\n") > 11


def test_the_base_install_prints_the_schema(base: Path) -> None:
    """`loopwarden schema` works with no extra and prints the full install's schema."""
    res = lw(base, "schema")
    assert res.returncode == 0, res.stderr
    full = subprocess.run([sys.executable, "-m", "loopwarden.cli", "schema"], capture_output=True, text=True, check=True)
    assert res.stdout == full.stdout


@pytest.mark.parametrize(("args", "line"), [
    (["keys", "new", "--key-id", "v1", "--out", "v1.key"],
     "loopwarden keys needs the 'processor' extra (cryptography): pip install 'loopwarden[processor]'"),
    (["replay", "--trusted-verifiers", "v1=AAAA", "-"],
     "loopwarden --trusted-verifiers needs the 'processor' extra (cryptography): pip install 'loopwarden[processor]'"),
    (["worker", "--broker", "kafka:9092"],
     "loopwarden worker: needs the Kafka processor, which is not installed: pip install 'loopwarden[processor]'"),
    (["verify", "--config", "verify.toml"],
     "loopwarden verify: needs the Kafka processor, which is not installed: pip install 'loopwarden[processor]'"),
])
def test_a_command_that_needs_an_extra_names_it_in_one_line(base: Path, args: list[str], line: str) -> None:
    """With no extra, a command (or flag) that needs one exits 1 with one line naming it, no traceback."""
    res = lw(base, *args)
    assert res.returncode == 1
    assert res.stderr.strip().splitlines() == [line]
