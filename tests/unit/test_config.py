"""Processor configuration: environment and flags, and errors that name the bad value."""

from __future__ import annotations

import pytest

from loopwarden.config import Config, from_env
from loopwarden.engine.exceptions import ConfigError


def test_flags_override_environment_which_overrides_defaults() -> None:
    """A flag beats LOOPWARDEN_*; unset flags (None) leave the environment's value."""
    env = {"LOOPWARDEN_BROKER": "k1:9092,k2:9092", "LOOPWARDEN_PARTITIONS": "12", "LOOPWARDEN_STORE": "rocksdb"}
    cfg = from_env({"partitions": 3, "store": None}, environ=env)
    assert (cfg.broker, cfg.partitions, cfg.store) == ("k1:9092,k2:9092", 3, "rocksdb")
    assert cfg.changelog_topic == "loopwarden-runs-changelog"
    assert from_env({}, environ={}) == Config()


@pytest.mark.parametrize("env,message", [
    ({"LOOPWARDEN_PARTITIONS": "eight"}, r"LOOPWARDEN_PARTITIONS: 'eight' is not a valid int"),
    ({"LOOPWARDEN_PARTITIONS": "0"}, r"partitions: 0 must be between 1 and 10000"),
    ({"LOOPWARDEN_STORE": "redis"}, r"store: 'redis' must be one of memory, rocksdb"),
    ({"LOOPWARDEN_CLOCK": "lamport"}, r"clock: 'lamport' must be one of wall, event"),
    ({"LOOPWARDEN_BROKER": "localhost"}, r"broker: 'localhost' is not host:port"),
    ({"LOOPWARDEN_STEPS_TOPIC": "bad topic"}, r"steps_topic: 'bad topic' is not a valid Kafka topic name"),
    ({"LOOPWARDEN_HEALTH_TOPIC": "agent.steps"}, r"topic names must differ"),
    ({"LOOPWARDEN_TOKEN": "short"}, r"token: must be at least 16 characters"),
    ({"LOOPWARDEN_WEB_PORT": "70000"}, r"web_port: 70000 must be between 0 and 65535"),
    ({"LOOPWARDEN_TICK_INTERVAL_S": "0"}, r"tick_interval_s: 0.0 must be between 0.05 and 3600"),
    ({"LOOPWARDEN_SHUTDOWN_TIMEOUT_S": "0.5"}, r"shutdown_timeout_s: 0.5 must be between 1 and 3600"),
    ({"LOOPWARDEN_SHUTDOWN_TIMEOUT_S": "soon"}, r"LOOPWARDEN_SHUTDOWN_TIMEOUT_S: 'soon' is not a valid float"),
    ({"LOOPWARDEN_BATCH_MAX_RECORDS": "0"}, r"batch_max_records: 0 must be between 1 and 1000000"),
    ({"LOOPWARDEN_BATCH_WAIT_MS": "-1"}, r"batch_wait_ms: -1 must be between 0 and 10000"),
    ({"LOOPWARDEN_STALL_TIMEOUT_S": "0"}, r"stall_timeout_s: 0.0 must be between 1 and 86400"),
    ({"LOOPWARDEN_MAX_MESSAGE_BYTES": "100"}, r"max_message_bytes: 100 must be between 10000 and 100000000"),
    ({"LOOPWARDEN_SESSION_TIMEOUT_S": "0.1"}, r"session_timeout_s: 0.1 must be between 1 and 300"),
    ({"LOOPWARDEN_SECURITY_PROTOCOL": "TLS"}, r"security_protocol: 'TLS' must be one of PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL"),
    ({"LOOPWARDEN_SECURITY_PROTOCOL": "SASL_SSL"}, r"sasl_mechanism: None must be one of PLAIN, SCRAM-SHA-256, SCRAM-SHA-512"),
    ({"LOOPWARDEN_SECURITY_PROTOCOL": "SASL_PLAINTEXT", "LOOPWARDEN_SASL_MECHANISM": "PLAIN",
      "LOOPWARDEN_SASL_USERNAME": "u"}, r"security_protocol=SASL_PLAINTEXT needs sasl_username and sasl_password"),
    ({"LOOPWARDEN_SASL_USERNAME": "u"}, r"sasl_username is set but security_protocol=PLAINTEXT does not use SASL"),
    ({"LOOPWARDEN_SSL_CAFILE": "/ca.pem"}, r"ssl_cafile is set but security_protocol=PLAINTEXT does not use TLS"),
    ({"LOOPWARDEN_SECURITY_PROTOCOL": "SSL", "LOOPWARDEN_SSL_KEYFILE": "/k.pem"}, r"ssl_keyfile is set without ssl_certfile"),
    ({"LOOPWARDEN_SSL_CHECK_HOSTNAME": "maybe"}, r"LOOPWARDEN_SSL_CHECK_HOSTNAME: 'maybe' is not a valid bool"),
    ({"LOOPWARDEN_BROKER": "SASL_SSL://k:9093"}, r"the protocol is a setting of its own: LOOPWARDEN_SECURITY_PROTOCOL"),
    ({"LOOPWARDEN_MALLOC_TRIM_S": "0.5"}, r"malloc_trim_s: 0.5 must be 0 \(never\) or between 1 and 86400"),
    ({"LOOPWARDEN_LOG_LEVEL": "verbose"}, r"log_level: 'verbose' must be one of debug, info, warning, error"),
    ({"LOOPWARDEN_WEB_HOST": "my host!"}, r"web_host: 'my host!' is not a host name or IP address"),
])
def test_bad_values_are_named(env, message) -> None:
    """Each bad setting fails fast with a message naming the setting and the value."""
    with pytest.raises(ConfigError, match=message):
        from_env({}, environ=env)


def test_an_empty_setting_is_an_error_not_the_default() -> None:
    """`LOOPWARDEN_X=` (set, empty) is refused naming the variable, for every setting: it never silently
    means the default."""
    from dataclasses import fields

    for f in fields(Config):
        name = f"LOOPWARDEN_{f.name.upper()}"
        with pytest.raises(ConfigError, match=rf"^{name} is set but empty: give it a value, or unset it"):
            from_env({}, environ={name: ""})
        with pytest.raises(ConfigError, match=rf"^{name} is set but empty"):
            from_env({}, environ={name: "  "})


@pytest.mark.parametrize("env,setting", [
    ({"LOOPWARDEN_LOG_LEVEL": "verbose"}, "LOOPWARDEN_LOG_LEVEL: 'verbose'"),  # named as the user set it
    ({"LOOPWARDEN_BROKER": ""}, "LOOPWARDEN_BROKER is set but empty"),
    ({"LOOPWARDEN_PARTITIONS": "many"}, "LOOPWARDEN_PARTITIONS: 'many'"),
])
def test_a_bad_setting_is_one_line_from_the_worker(env, setting) -> None:
    """The worker refuses a bad setting with exactly one line naming it (no TypeError traceback)."""
    import os
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "loopwarden.cli", "worker"], capture_output=True, text=True,
                          timeout=60, env={**os.environ, **env})
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"loopwarden: {setting}"), proc.stderr


def test_advertised_url() -> None:
    """Peers reach a worker at canonical_url, else at its bind address (its host name for 0.0.0.0)."""
    import socket

    assert Config(web_host="10.0.0.7", web_port=7000).advertised_url == "http://10.0.0.7:7000"
    assert Config(web_host="0.0.0.0").advertised_url == f"http://{socket.gethostname()}:6066"
    assert Config(web_host="0.0.0.0", canonical_url="http://lw-0.lw:6066").advertised_url == "http://lw-0.lw:6066"
    with pytest.raises(ConfigError, match=r"canonical_url: 'lw-0:6066' must be http\(s\)://host:port"):
        Config(canonical_url="lw-0:6066")


def test_token_is_not_in_the_repr() -> None:
    """The token and the SASL password never show up when the config is logged."""
    assert "abcdefghijklmnopqrstuvwxyz" not in repr(Config(token="abcdefghijklmnopqrstuvwxyz"))
    cfg = Config(security_protocol="SASL_PLAINTEXT", sasl_mechanism="PLAIN", sasl_username="u", sasl_password="hunter2-pw")
    assert "hunter2-pw" not in repr(cfg) and "sasl_username='u'" in repr(cfg)


def test_the_configuration_doc_lists_every_setting_with_its_default_and_flag(capsys) -> None:
    """One place lists the settings: each Config field is a row of docs/configuration.md's table (env var,
    flag, default), and each flag there is one the worker command accepts."""
    import re
    from dataclasses import fields
    from pathlib import Path

    from loopwarden.cli import build_parser

    readme = (Path(__file__).resolve().parents[2] / "docs" / "configuration.md").read_text()
    rows = {m.group(1): (m.group(2), m.group(3)) for m in re.finditer(
        r"^\| `LOOPWARDEN_([A-Z_]+)` \| (?:`(--[a-z-]+)`|—) \| `?([^|`]*?)`? \|", readme, flags=re.M)}
    names = {f.name.upper() for f in fields(Config)}
    assert set(rows) == names, (names - set(rows), set(rows) - names)
    with pytest.raises(SystemExit):
        build_parser().parse_args(["worker", "--help"])
    with pytest.raises(SystemExit):
        build_parser().parse_args(["board", "--help"])
    help_text = capsys.readouterr().out
    for name, (flag, default) in rows.items():
        if flag:
            assert re.search(rf"{flag}\b", help_text), flag
        value = getattr(Config(), name.lower())
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            assert float(default) == float(value), (name, default, value)


def test_data_dir_under_a_missing_parent_is_a_configuration_error(tmp_path) -> None:
    """`worker --store rocksdb --data-dir <missing>/<dir>` exits with one line naming the path, no traceback."""
    import subprocess
    import sys

    missing = tmp_path / "no-such-parent" / "data"
    proc = subprocess.run([sys.executable, "-m", "loopwarden.cli", "worker", "--store", "rocksdb",
                           "--data-dir", str(missing), "--broker", "127.0.0.1:1"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert proc.stderr.strip() == (f"loopwarden: data_dir: {str(missing)!r}: its parent "
                                   f"{str(missing.parent)!r} does not exist or is not a directory (create it first)")
    a_file = tmp_path / "file"
    a_file.write_text("x")
    proc = subprocess.run([sys.executable, "-m", "loopwarden.cli", "worker", "--store", "rocksdb",
                           "--data-dir", str(a_file), "--broker", "127.0.0.1:1"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.strip() == f"loopwarden: data_dir: {str(a_file)!r} is not a directory"
    from loopwarden.engine.store import prepare_data_dir

    assert prepare_data_dir(str(tmp_path / "new")).is_dir()  # the directory itself is made
