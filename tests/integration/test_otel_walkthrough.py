"""docs/opentelemetry.md's "From zero to your runs' health" runs as written: its shell and Python blocks, in
order, against the test broker and the real Collector, end with the run VERIFYING on agent.health.

What differs from a reader's machine, and only that: the broker, topics, app id and HTTP ports are the
test's own (environment variables the commands read, and a copy of deploy/otel-collector.yaml with free
ports and its own topic), `.venv/bin/` is this interpreter, and the parts' lines (`make ...`, the local
broker's start) are not run: the test broker and `make setup`'s Collector stand for them."""

from __future__ import annotations

import os
import re
import shlex
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

import pytest
import yaml

from dev.localkafka import free_port
from tests.conftest import REPO
from tests.otel.collector import OTELCOL

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

DOC = REPO / "docs" / "opentelemetry.md"
SECTION = "## From zero to your runs' health"
PARTS = ("make ", ".venv/bin/python -m dev.localkafka ")  # what the test's broker and `make setup` stand for


def walkthrough_blocks() -> list[tuple[str, str]]:
    """(language, text) of each fenced block of the walkthrough section, in order."""
    text = DOC.read_text()
    start = text.index(SECTION)
    end = text.find("\n## ", start + len(SECTION))
    section = text[start:end if end != -1 else None]
    return [(m.group(1), m.group(2)) for m in re.finditer(r"^```(\w*)\n(.*?)^```$", section, flags=re.M | re.S)]


def as_here(line: str) -> str:
    here = {"loopwarden": f"{shlex.quote(sys.executable)} -m loopwarden.cli", "python": shlex.quote(sys.executable)}
    return re.sub(r"\.venv/bin/(loopwarden|python)\b", lambda m: here[m.group(1)], line)


def wait_for(what: str, ready, proc: subprocess.Popen, log: Path, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while not ready():
        assert proc.poll() is None, f"{what} exited with {proc.returncode}:\n{log.read_text()[-3000:]}"
        assert time.monotonic() < deadline, f"{what} not ready in {timeout_s:.0f}s:\n{log.read_text()[-3000:]}"
        time.sleep(0.2)


def listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
        return True
    except OSError:
        return False


def ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1) as resp:
            return resp.status == 200
    except OSError:
        return False


def test_walkthrough_blocks_are_shell_python_and_the_ai_sdk_lines():
    """The walkthrough is made of shell and Python blocks the test below runs, and the AI SDK's JavaScript."""
    kinds = [lang for lang, _ in walkthrough_blocks()]
    assert set(kinds) == {"sh", "python", "js"} and kinds.count("sh") == 3, kinds


def test_the_walkthrough_as_written_ends_with_the_run_verifying(kafka, tmp_path):
    """Topics, the Collector and `worker --otel` as the doc starts them, the doc's Python (tracer provider
    with 200 ms batching, every Python runtime's setup lines, a Pydantic AI run), then the doc's `tail`:
    the run goes RUNNING, then VERIFYING."""
    assert OTELCOL.is_file(), f"{OTELCOL} missing: run `make otelcol`"
    tag = uuid.uuid4().hex[:8]
    web_port, http_port = free_port(), free_port()
    grpc_port = free_port(exclude=(http_port,))
    config = yaml.safe_load((REPO / "deploy" / "otel-collector.yaml").read_text())
    config["receivers"]["otlp"]["protocols"]["http"]["endpoint"] = f"127.0.0.1:{http_port}"
    config["receivers"]["otlp"]["protocols"]["grpc"]["endpoint"] = f"127.0.0.1:{grpc_port}"
    config["exporters"]["kafka"]["traces"]["topic"] = f"otlp-{tag}"
    config["service"]["telemetry"] = {"metrics": {"level": "none"}}  # no :8888 shared with other collectors
    collector_yaml = tmp_path / "otel-collector.yaml"
    collector_yaml.write_text(yaml.safe_dump(config))
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOOPWARDEN_")}
    env.update({
        "KAFKA_BROKERS": kafka.bootstrap, "LOOPWARDEN_BROKER": kafka.bootstrap, "LOOPWARDEN_APP_ID": f"lw-{tag}",
        "LOOPWARDEN_OTEL_TOPIC": f"otlp-{tag}", "LOOPWARDEN_STEPS_TOPIC": f"steps-{tag}",
        "LOOPWARDEN_OUTCOMES_TOPIC": f"outcomes-{tag}", "LOOPWARDEN_HEALTH_TOPIC": f"health-{tag}",
        "LOOPWARDEN_DEADLETTER_TOPIC": f"dead-{tag}", "LOOPWARDEN_TICKS_TOPIC": f"ticks-{tag}",
        "LOOPWARDEN_WEB_PORT": str(web_port),
    })
    background: list[tuple[str, subprocess.Popen, Path]] = []
    outputs: list[str] = []
    try:
        for i, (lang, text) in enumerate(walkthrough_blocks()):
            if lang == "python":
                continue  # run together below, once what they export to is up
            if lang != "sh":
                continue  # the AI SDK's lines: tests/otel/ai-sdk/run.mjs registers the same tracer
            for line in text.splitlines():
                if not line.strip() or line.startswith(PARTS):
                    continue
                line = as_here(line).replace("deploy/otel-collector.yaml", str(collector_yaml))
                if line.rstrip().endswith("&"):
                    log = tmp_path / f"bg-{len(background)}.log"
                    with open(log, "wb") as out:
                        proc = subprocess.Popen(["bash", "-c", "exec " + line.rstrip().rstrip("&")], cwd=REPO,
                                                env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
                    background.append((line, proc, log))
                    continue
                if "tail" in line.split():  # after the run: the doc's Python first
                    _run_python(env, http_port, background, web_port)
                res = subprocess.run(["bash", "-c", line], cwd=REPO, env=env, capture_output=True, text=True,
                                     timeout=120)
                assert res.returncode == 0, f"{line}\n{res.stdout}\n{res.stderr}"
                outputs.append(res.stdout)
        assert len(background) == 2, [b[0] for b in background]
        transitions = outputs[-1]
        lines = transitions.strip().splitlines()  # `tail --agent hello-agent`: that run's transitions only
        assert len(lines) == 2 and "-> RUNNING" in lines[0], transitions
        assert "RUNNING -> VERIFYING" in lines[1] and lines[1].split()[-1] == "natural_finish", transitions
    finally:
        for _line, proc, _log in background:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(20)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()


def _run_python(env: dict, http_port: int, background: list, web_port: int) -> None:
    """The doc's Python blocks as one script, once the Collector listens and the worker is ready."""
    (_l, collector, collector_log), (_w, worker, worker_log) = background
    wait_for("otelcol", lambda: listening(http_port), collector, collector_log)
    wait_for("loopwarden worker --otel", lambda: ready(web_port), worker, worker_log)
    script = "\n\n".join(text for lang, text in walkthrough_blocks() if lang == "python")
    script = script.replace("http://127.0.0.1:4318/v1/traces", f"http://127.0.0.1:{http_port}/v1/traces")
    res = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
