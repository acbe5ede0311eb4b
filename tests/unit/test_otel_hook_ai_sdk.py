"""The producer hook's attributes on AI SDK 7 (Node), set as docs/opentelemetry.md shows: its spans through the bridge."""

from __future__ import annotations

import functools
import json
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from loopwarden.codecs import RunStarted, decode_input
from tests.e2e.test_ai_sdk_agents import _node
from tests.otel.bridge import final_by_agent, replay, through_bridge

HARNESS = Path(__file__).resolve().parents[1] / "otel" / "ai-sdk"
SECRET = "s3cr3t-PLANTED-0xC0FFEE"  # planted by run.mjs in every prompt, tool argument and result


class _Receiver(BaseHTTPRequestHandler):
    """An OTLP/HTTP endpoint keeping each export request's body (the JS exporter sends them chunked)."""

    bodies: list[bytes]

    def do_POST(self) -> None:
        if "Content-Length" in self.headers:
            body = self.rfile.read(int(self.headers["Content-Length"]))
        else:
            body = b""
            while size := int(self.rfile.readline().split(b";")[0], 16):
                body += self.rfile.read(size)
                self.rfile.readline()
            self.rfile.readline()
        self.bodies.append(body)
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args) -> None:
        pass


@functools.cache
def outcome() -> tuple[dict, dict, list, dict]:
    """run.mjs --hook once, its export requests through the bridge: expected, reached, outputs, run_started by agent."""
    node = _node()
    assert (HARNESS / "node_modules" / "@ai-sdk" / "otel").is_dir(), "run `make node` (npm ci in tests/otel/ai-sdk)"
    handler = type("Receiver", (_Receiver,), {"bodies": []})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        endpoint = f"http://127.0.0.1:{server.server_port}/v1/traces"
        done = subprocess.run([node, "run.mjs", "--endpoint", endpoint, "--hook"], cwd=HARNESS, capture_output=True,
                              text=True, timeout=120)
    finally:
        server.shutdown()
        server.server_close()
    assert done.returncode == 0, done.stderr[-3000:]
    expected = {e["agent"]: (e["state"], e["reason"]) for e in map(json.loads, done.stdout.splitlines())}
    b = through_bridge(handler.bodies)
    assert b.deadletters == []
    events = b.events()
    return expected, final_by_agent(events), b.outputs, {e.agent: e for e in events if isinstance(e, RunStarted)}


def _only(table: dict, suffix: str) -> dict:
    return {agent: v for agent, v in table.items() if agent.endswith(suffix)}


def test_with_the_hook_ai_sdk_approvals_and_stop_conditions_reach_the_sdks_own_state():
    """needsApproval marked: WAITING_UNROUTED, routed WAITING; a stopWhen budget marked with its policy: BOUNDED_STOP."""
    expected, got, _, _ = outcome()
    assert _only(expected, "-hook") == {
        "sdk-approval-hook": ("WAITING_UNROUTED", "approval_required"),
        "sdk-approval-routed-hook": ("WAITING", "approval_required"),
        "sdk-step-budget-hook": ("BOUNDED_STOP", "stop_condition"),
    }
    assert _only(got, "-hook") == _only(expected, "-hook")


def test_the_ai_sdk_runs_policy_is_the_one_set_in_loopwarden_policy():
    """The policy enrichSpan puts on every span is run_started's, so the fired custom id counts as its bound."""
    _, _, _, started = outcome()
    policy = started["sdk-step-budget-hook"].policy
    assert policy.version == "ai-sdk-budget@1" and policy.stop_when[0].name == "step_budget"
    assert getattr(started["sdk-step-budget-bare"].policy, "version", None) != "ai-sdk-budget@1"


def test_without_the_hook_the_same_ai_sdk_runs_stay_uncertain():
    """The same AI SDK runs without the attributes: UNCERTAIN, never a confident wrong state."""
    expected, got, _, _ = outcome()
    assert {agent: state for agent, (state, _reason) in _only(expected, "-bare").items()} == {
        "sdk-approval-bare": "UNCERTAIN", "sdk-step-budget-bare": "UNCERTAIN"}
    assert _only(got, "-bare") == _only(expected, "-bare")


def test_a_hung_ai_sdk_run_is_named_by_loopwarden_agent_from_its_first_event_and_goes_stuck():
    """Hung after its first step: loopwarden.agent names it at once (no run span ever names it), then STUCK."""
    _, _, outputs, started = outcome()
    hung = started["sdk-hung-hooked"]
    events = [decode_input(o.value) for o in outputs]
    first, *rest = [e for e in events if e.run_id == hung.run_id]
    assert first is hung or first == hung  # its first event is the named run_started
    assert rest == []  # its first step waits for the next model call (hung), the run span never comes
    last = replay(events, advance_s=400).final[hung.run_id]
    assert (last.to_state, last.reason) == ("STUCK", "no_progress")
    # the same run without it: nothing names it before its run span, so it waits start_grace_s for a name
    assert "ai-sdk-7" not in started and "sdk-hung-unhooked" not in started


def test_hooked_ai_sdk_runs_publish_no_content():
    """The secret run.mjs plants in every prompt, tool argument and result is in none of the bridge's events."""
    _, _, outputs, _ = outcome()
    assert outputs and all(SECRET.encode() not in o.value for o in outputs)
