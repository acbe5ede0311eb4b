"""Every client through a SASL_SSL listener: a broker with TLS (a CA and certificate
made in the test) and SCRAM users (created by the broker's storage tool); the worker, the publisher and
`loopwarden tail` connect with the settings; a wrong password, CA or mechanism is one clear line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from loopwarden.publisher import Publisher
from loopwarden.simulate import fleet
from loopwarden.config import Config
from loopwarden.engine.security import client_options
from tests.integration.harness import env_for, final_states, make_worker, run, tick, unique_config
from tests.integration.secure_broker import USERS, start_secure_broker
from tests.integration.test_processor import ADVANCE_MS, replay_final, wait_final

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    b = start_secure_broker(tmp_path_factory.mktemp("secure-kafka"))
    yield b
    b.kafka.stop()


def secure(config: Config, broker, mechanism: str = "SCRAM-SHA-256", **kw) -> Config:
    user, password = USERS[mechanism]
    settings = dict(broker=broker.secure, security_protocol="SASL_SSL", sasl_mechanism=mechanism,
                    sasl_username=user, sasl_password=password, ssl_cafile=str(broker.ca_file))
    return replace(config, **{**settings, **kw})


def cli(config: Config, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "loopwarden.cli", *args], env=env_for(config),
                          capture_output=True, text=True, timeout=120)


def test_worker_publisher_and_tail_through_sasl_ssl(broker, tmp_path: Path) -> None:
    plain = unique_config(broker.plain, clock="event")  # the tests' own reads and ticks
    config = secure(plain, broker)
    worker = make_worker(config, tmp_path, clock="event").start()
    try:
        messages = fleet(60, seed=41, bad_every=0)
        expected, last = replay_final(messages)

        async def publish() -> None:
            async with Publisher(config.broker, config.steps_topic, config.outcomes_topic,
                                 options=client_options(config)) as pub:
                for m in messages:
                    await pub.publish_raw(config.steps_topic if m.topic == "steps" else config.outcomes_topic,
                                          m.key, m.value)

        run(publish())
        run(tick(plain, last + ADVANCE_MS))
        wait_final(plain, expected)
        # tail through the same listener, as the other SCRAM user (SHA-512)
        res = cli(secure(config, broker, "SCRAM-SHA-512"), "tail", "--from-beginning", "--json", "--idle-exit-s", "5")
        assert res.returncode == 0, res.stderr
        assert final_states([json.loads(line) for line in res.stdout.splitlines()]) == expected
        assert worker.proc.poll() is None
        log = worker.log_tail(200)
        assert "Traceback" not in log
    finally:
        worker.stop()


@pytest.mark.parametrize("case,change,says", [
    ("wrong password", {"sasl_password": "not-the-password"},
     "SaslAuthenticationFailed: Authentication failed during authentication due to invalid credentials"),
    ("wrong mechanism", {"sasl_mechanism": "SCRAM-SHA-512"}, "SaslAuthenticationFailed"),
    ("wrong CA", {"ssl_cafile": None}, "CERTIFICATE_VERIFY_FAILED"),
    ("no TLS", {"security_protocol": "SASL_PLAINTEXT", "ssl_cafile": None},
     "does LOOPWARDEN_SECURITY_PROTOCOL (SASL_PLAINTEXT) match its listener?"),
])
def test_a_wrong_setting_is_one_clear_line(broker, case, change, says) -> None:
    config = secure(unique_config(broker.plain), broker)
    if case == "wrong CA":
        change = {"ssl_cafile": str(broker.other_ca_file)}
    bad = replace(config, **change)
    res = cli(bad, "tick", "--now-ms", "1")
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 1 and len(lines) == 1, res.stderr
    assert lines[0].startswith(f"loopwarden tick: cannot connect to Kafka at {broker.secure}: "), lines
    assert says in lines[0]
    if case in ("wrong password", "wrong mechanism"):
        assert lines[0].endswith("check LOOPWARDEN_SASL_USERNAME, LOOPWARDEN_SASL_PASSWORD and LOOPWARDEN_SASL_MECHANISM")
    if case == "wrong CA":
        assert "check LOOPWARDEN_SSL_CAFILE" in lines[0]


def test_a_missing_ca_file_is_a_configuration_error_before_any_connection(broker, tmp_path: Path) -> None:
    """A CA file that does not exist stops the command before it connects, in one line naming the variable it came from."""
    config = secure(unique_config(broker.plain), broker, ssl_cafile=None)
    env = {**env_for(config), "LOOPWARDEN_SSL_CAFILE": str(tmp_path / "nope.pem")}
    res = subprocess.run([sys.executable, "-m", "loopwarden.cli", "tail"], env=env, capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 1
    assert res.stderr.strip() == (f"loopwarden: LOOPWARDEN_SSL_CAFILE: {str(tmp_path / 'nope.pem')!r} cannot be used as a CA "
                                  "bundle ([Errno 2] No such file or directory)")
    assert os.environ.get("LOOPWARDEN_SASL_PASSWORD") is None  # nothing leaks into the test process
