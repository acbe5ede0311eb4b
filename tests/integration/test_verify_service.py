"""The verifier's scheduling, webhook intake and a person's receipt, on real files and a real HTTP intake."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import msgspec
import pytest

from loopwarden.codecs import OutcomeExpected, decode_input, decode_step_event
from loopwarden.replay import Replay
from loopwarden.trust import SigningKey, TrustedVerifiers
from loopwarden.verify.checkers import Measured, builtin_checkers, choose
from loopwarden.verify.config import VerifyConfig
from loopwarden.verify.service import Verifier, serve_http
from tests.builders import ended, started, step, timed
from dev.destinations import free_port

LW = [sys.executable, "-m", "loopwarden.cli"]


def _events(*events: dict) -> list:
    return [decode_step_event(json.dumps(e).encode()) for e in events]


def _expected(run: str, eid: str, target: str, ts: int = 1_000_500) -> dict:
    return {"type": "outcome_expected", "run_id": run, "ts": ts, "expectation_id": eid, "kind": "file",
            "target": target, "checks": {"min_size": 3}}


def test_expectations_are_checked_when_the_segment_ends_not_before_and_not_while_waiting(tmp_path: Path) -> None:
    """Nothing before run_ended; nothing at an approval stop; one receipt per expectation, even declared late."""
    (tmp_path / "a.txt").write_text("hello")
    config = VerifyConfig(file_prefixes=(str(tmp_path),), retry_negative_s=0)
    sent = []

    async def publish(r):
        sent.append(r)

    async def main():
        v = Verifier(config, SigningKey.generate("v"), publish)
        for ev in _events(*timed(started(run="r1"), _expected("r1", "e1", f"file://{tmp_path}/a.txt"), step(0, run="r1"))):
            v.on_event(ev)
        await v.idle()
        assert sent == []
        approval = {"approval_id": "ap", "tool_call_id": "tc", "tool_name": "pay", "owner": None,
                    "deadline_ts": None, "resume_token": None}
        for ev in _events(ended("approval_required", 1, run="r1", ts=1_003_000, approval=approval)):
            v.on_event(ev)
        await v.idle()
        assert sent == []  # the run is waiting for a person, not done
        for ev in _events(ended("natural_finish", 1, run="r1", ts=1_004_000, seg=1)):
            v.on_event(ev)
        await v.idle()
        assert [(r.receipt_id, r.verified) for r in sent] == [("e1", True)]
        for ev in _events(ended("natural_finish", 1, run="r1", ts=1_005_000, seg=2),  # a later segment: no repeat
                          _expected("r1", "e2", f"file://{tmp_path}/absent.txt", ts=1_006_000)):  # declared late
            v.on_event(ev)
        await v.idle()
        assert [(r.receipt_id, r.verified, r.evidence.get("reason")) for r in sent] == [
            ("e1", True, None), ("e2", False, "missing")]
        v.on_bytes(b'{"type":"outcome_expected"}')  # invalid: counted, skipped
        assert v.metrics.registry.get_sample_value("loopwarden_verify_events_total", {"type": "invalid"}) == 1
        assert v.forget_before(2_000_000) == 1 and not v.expected
    asyncio.run(main())


def test_each_receipt_signs_the_run_started_of_the_occurrence_it_checked(tmp_path: Path) -> None:
    """The receipt carries (signed) the ts of the run's latest run_started read; without one read, none."""
    (tmp_path / "a.txt").write_text("hello")
    config = VerifyConfig(file_prefixes=(str(tmp_path),), retry_negative_s=0)
    key, sent = SigningKey.generate("v"), []

    async def publish(r):
        sent.append(r)

    async def main():
        v = Verifier(config, key, publish)
        target = f"file://{tmp_path}/a.txt"
        for ev in _events(*timed(started(run="r1"), _expected("r1", "e1", target), step(0, run="r1"),
                                 ended("natural_finish", 1, run="r1"),
                                 _expected("r2", "e2", target), ended("natural_finish", 1, run="r2"))):
            v.on_event(ev)
        await v.idle()
    asyncio.run(main())
    bound = {r.receipt_id: r.run_started_ts for r in sent}
    assert bound == {"e1": 1_000_000, "e2": msgspec.UNSET}
    trusted = TrustedVerifiers.parse(key.setting)
    assert all(trusted.why_untrusted(r) is None for r in sent)
    assert trusted.why_untrusted(msgspec.structs.replace(sent[0], run_started_ts=1_000_001)) == "bad_signature"


def test_a_negative_answer_is_asked_again_until_the_outcome_lands_within_retry_negative_s(tmp_path: Path) -> None:
    """A file written a moment after the run ended is found by a retry: the receipt says verified."""
    config = VerifyConfig(file_prefixes=(str(tmp_path),), retry_negative_s=5, retry_initial_s=0.05)
    sent = []

    async def publish(r):
        sent.append(r)

    async def main():
        v = Verifier(config, SigningKey.generate("v"), publish)
        exp = OutcomeExpected(run_id="r", ts=1, expectation_id="e", kind="file", target=f"file://{tmp_path}/late.txt",
                              checks={"min_size": 3})
        task = asyncio.create_task(v.verify_one(exp, int(time.time() * 1000) + 60_000))
        await asyncio.sleep(0.3)
        (tmp_path / "late.txt").write_text("arrived")
        assert (await task).verified
        assert v.metrics.registry.get_sample_value("loopwarden_verify_checks_total",
                                                   {"checker": "file", "outcome": "retried"}) >= 1
    asyncio.run(main())


def test_a_crashing_plugin_checker_is_counted_and_the_verifier_goes_on(tmp_path: Path) -> None:
    """A checker that raises gives no receipt and an `error` count; the next expectation is still checked."""
    class Broken:
        name = "broken"

        def accepts(self, e):
            return e.target.startswith("file:") and "broken" in e.target

        async def check(self, e, ctx):
            raise RuntimeError("bug in a plug-in")

    class Always:
        name = "always"

        def accepts(self, e):
            return e.target.startswith("s3:")

        async def check(self, e, ctx):
            return Measured(True, {"size": 1})

    checkers = {"broken": Broken(), "always": Always(), **builtin_checkers()}
    sent = []

    async def publish(r):
        sent.append(r)

    async def main():
        v = Verifier(VerifyConfig(), SigningKey.generate("v"), publish, checkers=checkers)
        deadline = int(time.time() * 1000) + 60_000
        e1 = OutcomeExpected(run_id="r", ts=1, expectation_id="e1", kind="file", target="file:///broken")
        e2 = OutcomeExpected(run_id="r", ts=1, expectation_id="e2", kind="file", target="s3://bucket/key")
        assert await v.verify_one(e1, deadline) is None
        assert (await v.verify_one(e2, deadline)).verified
        assert v.metrics.registry.get_sample_value("loopwarden_verify_checks_total",
                                                   {"checker": "broken", "outcome": "error"}) == 1
    assert choose(checkers, OutcomeExpected(run_id="r", ts=1, expectation_id="e", kind="file",
                                            target="file:///x", checks={"json_schema": "s"})).name == "json_schema"
    asyncio.run(main())


def test_webhook_intake_turns_an_hmac_verified_delivery_into_a_signed_receipt(monkeypatch) -> None:
    """Right HMAC → 202 and a receipt the worker trusts; wrong or missing HMAC, unknown provider, bad body → refused."""
    monkeypatch.setenv("LW_TEST_MAILER_SECRET", "whsec-123")
    port = free_port()
    config = VerifyConfig(webhook_secrets={"mailer": "LW_TEST_MAILER_SECRET"}, web_port=port)
    key = SigningKey.generate("verifier-1")
    sent = []

    async def publish(r):
        sent.append(r)

    async def main():
        v = Verifier(config, key, publish)
        runner = await serve_http(v, "127.0.0.1", port)
        url = f"http://127.0.0.1:{port}/webhooks"
        body = json.dumps({"run_id": "r9", "receipt_id": "msg-77", "delivered": True,
                           "evidence": {"provider_message_id": "pm-1", "nested": {"x": 1}}}).encode()
        good = "sha256=" + hmac.new(b"whsec-123", body, hashlib.sha256).hexdigest()
        answers = []
        try:
            async with aiohttp.ClientSession() as s:
                for provider, data, sig in (("mailer", body, good), ("mailer", body, "sha256=" + "0" * 64),
                                            ("mailer", body, None), ("other", body, good),
                                            ("mailer", b"{}", "sha256=" + hmac.new(b"whsec-123", b"{}", hashlib.sha256).hexdigest())):
                    headers = {"X-Loopwarden-Signature": sig} if sig else {}
                    async with s.post(f"{url}/{provider}", data=data, headers=headers) as resp:
                        answers.append(resp.status)
                async with s.get(f"http://127.0.0.1:{port}/metrics") as resp:
                    metrics = await resp.text()
        finally:
            await runner.cleanup()
        return answers, metrics

    answers, metrics = asyncio.run(main())
    assert answers == [202, 401, 401, 404, 400]
    assert len(sent) == 1
    r = sent[0]
    assert (r.run_id, r.receipt_id, r.kind, r.verified, r.verifier) == ("r9", "msg-77", "message", True, "destination")
    assert r.evidence == {"provider_message_id": "pm-1", "provider": "mailer"}
    assert TrustedVerifiers.parse(key.setting).why_untrusted(r) is None
    assert 'loopwarden_verify_webhooks_total{outcome="bad_signature"} 2.0' in metrics


def test_a_persons_signed_receipt_decides_a_run_only_when_their_key_is_trusted(tmp_path: Path) -> None:
    """`loopwarden receipt --verified` signed with a person's key: VERIFIED_COMPLETE with it trusted, nothing without."""
    person = tmp_path / "alice.key"
    setting = subprocess.run([*LW, "keys", "new", "--key-id", "alice", "--out", str(person)],
                             capture_output=True, text=True, check=True).stdout.strip()
    proc = subprocess.run([*LW, "receipt", "r", "--kind", "analysis", "--verified", "--key", str(person),
                           "--note-code", "TICKET-12", "--out", "-"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    receipt = json.loads(proc.stdout)
    assert (receipt["verifier"], receipt["receipt_id"], receipt["evidence"]) == (
        "human", "human:analysis:alice", {"decided_by": "alice", "note_code": "TICKET-12"})
    run_events = timed(started(required_outcomes=["analysis"]), step(0), ended("natural_finish", 1),
                       start=receipt["ts"] - 5000)  # the run ended just before the person decided
    events = [decode_input(json.dumps(e).encode()) for e in [*run_events, receipt]]
    for verifiers, final in ((TrustedVerifiers.parse(setting), "VERIFIED_COMPLETE"),
                             (TrustedVerifiers.parse(SigningKey.generate("bob").setting), "VERIFYING")):
        replay = Replay(verifiers=verifiers, keep_final=True)
        for e in events:
            replay.feed(e)
        assert replay.final["r"].to_state == final
    bound = subprocess.run([*LW, "receipt", "r", "--kind", "analysis", "--verified", "--key", str(person),
                            "--run-started-ts", str(run_events[0]["ts"]), "--out", "-"], capture_output=True, text=True)
    assert bound.returncode == 0, bound.stderr
    signed = decode_input(bound.stdout.encode())
    assert signed.run_started_ts == run_events[0]["ts"] and TrustedVerifiers.parse(setting).why_untrusted(signed) is None
    bad = subprocess.run([*LW, "receipt", "r", "--kind", "file", "--rejected", "--key", str(tmp_path / "none.key")],
                         capture_output=True, text=True)
    assert bad.returncode != 0 and "none.key" in bad.stderr and "cannot read" in bad.stderr


@pytest.mark.parametrize(("toml", "message"), [
    ("check_timeout_s = 0", "check_timeout_s: 0 must be a number between"),
    ("max_concurrency = 0", "max_concurrency: 0 must be an integer"),
    ("[file]\nprefixes = ['relative/dir']", "file.prefixes: 'relative/dir' must be an absolute directory path"),
    ("[http]\nhosts = ['https://x.example']", "http.hosts: 'https://x.example' must be host or host:port"),
    ("[json_schemas]\nreport = '/no/such/schema.json'", "json_schemas.report: '/no/such/schema.json' is not a readable"),
    ("[[postgresql.databases]]\nhost = 'db'", "postgresql.databases\\[0\\]: .* needs host, dbname, user"),
    ("[[postgresql.databases]]\nhost = 'db'\ndbname = 'app'\nuser = 'v'",
     "postgresql.databases\\[0\\] \\(db:5432/app\\): tables is required"),
    ("[[postgresql.databases]]\nhost = 'db'\ndbname = 'app'\nuser = 'v'\ntables = ['t']\nsslmode = 'require'",
     "postgresql.databases\\[0\\] \\(db:5432/app\\): sslmode 'require' must be one of verify-full, verify-ca, disable"),
    ("[[postgresql.databases]]\nhost = 'db'\ndbname = 'app'\nuser = 'v'\ntables = ['t']\nssl = false",
     "postgresql.databases\\[0\\]: unknown setting 'ssl'"),
    ("colour = 'red'", "unknown setting 'colour'"),
    ("broker = ", "not valid TOML"),
])
def test_a_bad_verifier_config_stops_startup_naming_the_setting(tmp_path: Path, toml: str, message: str) -> None:
    """`loopwarden verify --config` exits with the bad setting and its value in the message."""
    path = tmp_path / "verify.toml"
    path.write_text(toml + "\n")
    proc = subprocess.run([*LW, "verify", "--config", str(path)], capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    import re

    assert re.search(message, proc.stderr), proc.stderr


# What a checker's driver, blocked in the child before it starts, leaves the verifier to do.
_BLOCKED = "import sys; sys.modules[{module!r}] = None; from loopwarden.cli import main; sys.exit(main(sys.argv[1:]))"


@pytest.mark.parametrize(("toml", "module", "section"), [
    ("[[postgresql.databases]]\nhost = 'db'\ndbname = 'billing'\nuser = 'v'\ntables = ['invoices']", "asyncpg",
     "[postgresql]"),
    ("[json_schemas]\nreport = '{schema}'", "jsonschema", "[json_schemas]"),
])
def test_a_config_whose_checker_needs_the_verify_extra_is_refused_at_start_naming_it(
        tmp_path: Path, toml: str, module: str, section: str) -> None:
    """With the checker's driver not installed (the `processor` extra only), `loopwarden verify` refuses
    the config at start in one line naming the `verify` extra, instead of failing every check later."""
    schema = tmp_path / "report.json"
    schema.write_text("{}")
    path = tmp_path / "verify.toml"
    path.write_text(toml.format(schema=schema) + "\n")
    proc = subprocess.run([sys.executable, "-c", _BLOCKED.format(module=module), "verify", "--config", str(path)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        f"loopwarden verify: the config's {section} needs {module}, from the 'verify' extra: "
        "pip install 'loopwarden[verify]'"]


def test_a_verifier_port_in_use_is_one_line_naming_the_setting(tmp_path: Path) -> None:
    """`loopwarden verify` whose web_port another process holds exits 1 with one line naming the port and
    the setting, no traceback (it binds before it reaches for the broker, as the worker and the board)."""
    import socket

    SigningKey.generate("v").save(str(tmp_path / "v.key"))
    path = tmp_path / "verify.toml"
    path.write_text(f"broker = '127.0.0.1:{free_port()}'\nsigning_key = '{tmp_path / 'v.key'}'\n")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = subprocess.run([*LW, "verify", "--config", str(path), "--web-port", str(port)],
                              capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr and "Unclosed" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == (
        f"loopwarden verify: port {port} on 127.0.0.1 is already in use (another process listens there): "
        "choose another with --web-port or web_port in the config")


def test_the_python_publisher_sends_expectations_and_signed_receipts(kafka) -> None:
    """Publisher.expect_outcome lands on the steps topic and publish_receipt signs onto the outcomes topic."""
    from loopwarden.codecs import decode_outcome_event
    from loopwarden.publisher import Publisher
    from tests.integration.harness import read_topic, run, unique_config

    config = unique_config(kafka.bootstrap, partitions=1)
    key = SigningKey.generate("py-verifier")

    async def main():
        async with Publisher(kafka.bootstrap, config.steps_topic, config.outcomes_topic) as pub:
            exp = await pub.expect_outcome("r1", "e1", "file", "file:///srv/out/a.pdf", {"min_size": 10}, wait=True)
            from loopwarden.codecs import OutcomeReceipt

            signed = await pub.publish_receipt(OutcomeReceipt(run_id="r1", ts=1, receipt_id="e1", kind="file",
                                                              verifier="destination", verified=True), key, wait=True)
        return exp, signed

    exp, signed = run(main())
    steps = run(read_topic(config, config.steps_topic, lambda r: len(r) >= 1, 30))
    outs = run(read_topic(config, config.outcomes_topic, lambda r: len(r) >= 1, 30))
    assert decode_step_event(steps[0].value) == exp and steps[0].key == b"r1"
    got = decode_outcome_event(outs[0].value)
    assert got == signed and TrustedVerifiers.parse(key.setting).why_untrusted(got) is None
    assert os.environ.get("LOOPWARDEN_TRUSTED_VERIFIERS") is None


def test_the_verifier_waits_for_the_steps_topic_and_never_creates_it(kafka, tmp_path: Path) -> None:
    """`loopwarden verify` started before any worker, on a broker that auto-creates topics, says it waits
    for the steps topic and leaves it missing (a reader never creates a topic); SIGTERM stops it cleanly."""
    import signal

    from tests.integration.harness import run, unique_config
    from loopwarden.stages.topics import partition_count

    config = unique_config(kafka.bootstrap)
    SigningKey.generate("v").save(str(tmp_path / "v.key"))
    path = tmp_path / "verify.toml"
    path.write_text(f"broker = '{kafka.bootstrap}'\nsigning_key = '{tmp_path / 'v.key'}'\n"
                    f"steps_topic = '{config.steps_topic}'\noutcomes_topic = '{config.outcomes_topic}'\n"
                    f"web_port = {free_port()}\n")
    proc = subprocess.Popen([*LW, "verify", "--config", str(path)], stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        line = ""
        while "waiting for topic" not in line:
            assert time.monotonic() < deadline and proc.poll() is None, line
            line = proc.stderr.readline()
        assert config.steps_topic in line
        time.sleep(3)
        assert run(partition_count(config, config.steps_topic)) is None
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 0 and "Traceback" not in err, err
        assert run(partition_count(config, config.steps_topic)) is None
    finally:
        if proc.poll() is None:
            proc.kill()
