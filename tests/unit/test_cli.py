"""The CLI as a newcomer meets it: --version, every env var in `worker --help`, flags a command would
ignore refused, and the Kafka commands without the [processor] extra naming what to install."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import fields

import pytest

from loopwarden.cli import KAFKA_COMMANDS, main
from loopwarden.config import Config


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "loopwarden.cli", *args], capture_output=True, text=True, timeout=60)


def test_version() -> None:
    from importlib.metadata import version

    res = cli("--version")
    assert res.returncode == 0 and res.stdout.strip() == f"loopwarden {version('loopwarden')}"


def test_worker_help_names_every_environment_variable_with_its_default() -> None:
    res = cli("worker", "--help")
    assert res.returncode == 0
    for f in fields(Config):
        line = next((ln for ln in res.stdout.splitlines() if f"LOOPWARDEN_{f.name.upper()} " in ln), None)
        assert line is not None, f.name
        default = getattr(Config(), f.name)
        assert line.split()[-1] == ("unset" if default is None else str(default)), line
    assert "LOOPWARDEN_TOKEN" in res.stdout and "LOOPWARDEN_REPLICATION" in res.stdout


@pytest.mark.parametrize("args,flag", [
    (["tail", "--steps-topic", "x"], "--steps-topic"),
    (["tail", "--partitions", "3"], "--partitions"),
    (["tick", "--now-ms", "1", "--health-topic", "h"], "--health-topic"),
    (["tick", "--now-ms", "1", "--partitions", "3"], "--partitions"),
    (["simulate", "--store", "rocksdb"], "--store"),
])
def test_a_flag_the_command_would_ignore_is_refused(args, flag) -> None:
    res = cli(*args)
    assert res.returncode == 2
    assert f"unrecognized arguments: {flag}" in res.stderr


def test_tail_and_tick_keep_the_flags_they_use() -> None:
    for args, flag in ((["tail"], "--health-topic"), (["tick"], "--ticks-topic"), (["simulate"], "--partitions")):
        res = cli(*args, "--help")
        assert res.returncode == 0 and flag in res.stdout and "--broker" in res.stdout


@pytest.mark.parametrize("command", sorted(KAFKA_COMMANDS))
def test_without_the_processor_extra_a_kafka_command_names_the_extra(command, capsys) -> None:
    """A core-only install (no aiokafka) still lists the Kafka commands; asking for one, with any
    flags, exits with one line naming what to install."""
    with pytest.raises(SystemExit) as exc:
        main([command, "--broker", "k:9092", "--anything"], processor=False)
    assert str(exc.value) == (f"loopwarden {command}: needs the Kafka processor, which is not installed: "
                              "pip install 'loopwarden[processor]'")
    with pytest.raises(SystemExit):
        main(["--help"], processor=False)
    assert command in capsys.readouterr().out


@pytest.mark.parametrize("args", [["tail"], ["simulate", "--runs", "1"], ["tick", "--now-ms", "1"],
                                  ["worker", "--web-port", "0"], ["board", "--board-port", "0"]])
def test_an_unreachable_broker_is_one_line_not_a_traceback(args) -> None:
    """A broker nobody listens at: one line naming it and aiokafka's reason, said once (not after aiokafka's
    own ERROR line), exit 1."""
    from dev.localkafka import free_port

    broker = f"127.0.0.1:{free_port()}"  # nothing listens there
    res = cli(*args, "--broker", broker)
    assert res.returncode == 1
    assert "Traceback" not in res.stderr and "Unclosed" not in res.stderr
    last = res.stderr.strip().splitlines()[-1]
    assert last.startswith(f"loopwarden {args[0]}: cannot connect to Kafka at {broker}: ")
    assert "Connect call failed" in last and last.endswith("; is the broker up? (--broker / LOOPWARDEN_BROKER)")
    assert "Unable connect" not in res.stderr and "Error: KafkaConnectionError" not in res.stderr
    if args[0] not in ("worker", "board"):  # the services print their settings first; the client commands only this
        assert res.stderr.strip() == last


@pytest.mark.parametrize("args", [["receipt", "r1", "--kind", "file", "--verified"],
                                  ["act", "r1", "retry", "--reason", "checked the tool"]])
def test_a_signed_event_for_an_unreachable_broker_is_one_line_not_a_traceback(args, tmp_path) -> None:
    """`loopwarden receipt` and `loopwarden act` at a broker nobody listens at: the client commands' one line, exit 1."""
    from dev.localkafka import free_port

    key = tmp_path / "ops.key"
    assert cli("keys", "new", "--key-id", "ops", "--out", str(key)).returncode == 0
    broker = f"127.0.0.1:{free_port()}"
    res = cli(*args, "--key", str(key), "--broker", broker)
    assert res.returncode == 1
    assert "Traceback" not in res.stderr
    assert res.stderr.strip().startswith(f"loopwarden {args[0]}: cannot connect to Kafka at {broker}: "), res.stderr
    assert res.stderr.strip().endswith("; is the broker up? (--broker / LOOPWARDEN_BROKER)"), res.stderr
    assert len(res.stderr.strip().splitlines()) == 1, res.stderr


def test_dev_from_an_installed_package_says_where_the_demo_runs() -> None:
    """`loopwarden dev` (the demo needs the checkout's Maven build of Kafka) exits with what to do instead."""
    res = cli("dev")
    assert res.returncode == 1 and "Traceback" not in res.stderr
    assert "make dev" in res.stderr and "loopwarden worker --broker" in res.stderr


def test_tail_help_links_every_state_to_its_doc() -> None:
    """`tail --help` lists every health state with what to do and its line in docs/states.md."""
    from loopwarden.codecs import STATES

    res = cli("tail", "--help")
    assert res.returncode == 0
    for state in STATES:
        line = next(ln for ln in res.stdout.splitlines() if ln.strip().startswith(state + " "))
        assert line.rstrip().endswith(f"docs/states.md#{state.lower()}"), line


def test_the_cli_sets_up_the_worker_process_in_one_place() -> None:
    """`loopwarden worker`'s logging, collector thresholds and post-recovery hook (gc.freeze) come from set_up_process."""
    code = (
        "import gc, logging, sys\n"
        "from loopwarden import cli, gctune\n"
        "args = cli.build_parser().parse_args(['worker'])\n"
        "assert not logging.getLogger().handlers and gc.get_threshold() != gctune.THRESHOLDS\n"
        "cli.set_up_process(args)\n"
        "assert gc.get_threshold() == gctune.THRESHOLDS and logging.getLogger().handlers\n"
        "assert args.on_recovered is cli._recovered\n"
        "from loopwarden.commands import logs\n"
        "assert any(isinstance(f, logs.RepeatFilter) for f in logging.getLogger('aiokafka').filters)\n"
        "assert any(isinstance(f, logs.FencedLeftovers) for f in logging.getLogger('asyncio').filters)\n"
    )
    env = {k: v for k, v in __import__("os").environ.items() if not k.startswith("LOOPWARDEN_")}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize(("args", "setting"), [
    (["worker", "--web-port"], "choose another with --web-port (LOOPWARDEN_WEB_PORT)"),
    (["bridge", "--web-port"], "choose another with --web-port (LOOPWARDEN_WEB_PORT)"),
    (["board", "--board-port"], "choose another with --board-port (LOOPWARDEN_BOARD_PORT)"),
])
def test_a_port_in_use_is_one_line_naming_the_port_and_its_setting(args, setting) -> None:
    """A service whose HTTP port another process holds exits 1 with one line naming the port and the
    setting that moves it, no traceback (it binds before it reaches for the broker)."""
    import socket

    from dev.localkafka import free_port

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        res = cli(*args, str(port), "--broker", f"127.0.0.1:{free_port()}")
    assert res.returncode == 1, res.stderr
    assert "Traceback" not in res.stderr
    assert res.stderr.strip().splitlines()[-1] == (
        f"loopwarden {args[0]}: port {port} on 127.0.0.1 is already in use (another process listens there): {setting}")


def test_the_board_and_the_verifier_listen_on_ports_of_their_own_by_default() -> None:
    """The worker, the board and the verifier run side by side on one host with their default ports."""
    from loopwarden.verify.config import VerifyConfig

    assert len({Config().web_port, Config().board_port, VerifyConfig().web_port}) == 3


def test_a_second_worker_on_a_data_dir_in_use_is_refused_naming_the_dir(tmp_path) -> None:
    """`worker --store rocksdb` on a data directory whose lock another process holds exits 1 with one line
    naming the directory, before it reaches for the broker."""
    import fcntl

    from dev.localkafka import free_port

    data = tmp_path / "data"
    data.mkdir()
    with open(data / "loopwarden.lock", "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)  # as the first worker holds it
        res = cli("worker", "--store", "rocksdb", "--data-dir", str(data), "--web-port", "0",
                  "--broker", f"127.0.0.1:{free_port()}")
    assert res.returncode == 1, res.stderr
    assert res.stderr.strip().splitlines() == [
        f"loopwarden: data_dir: {str(data)!r} is in use by another worker (it holds {data / 'loopwarden.lock'}): "
        "give each worker its own --data-dir (LOOPWARDEN_DATA_DIR)"]


def test_a_bad_setting_from_the_environment_is_named_by_its_variable() -> None:
    """`LOOPWARDEN_LOG_LEVEL=loud` is said as LOOPWARDEN_LOG_LEVEL, the name the user set."""
    env = {k: v for k, v in __import__("os").environ.items() if not k.startswith("LOOPWARDEN_")}
    res = subprocess.run([sys.executable, "-m", "loopwarden.cli", "worker"], env={**env, "LOOPWARDEN_LOG_LEVEL": "loud"},
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 1
    assert res.stderr.strip() == "loopwarden: LOOPWARDEN_LOG_LEVEL: 'loud' must be one of debug, info, warning, error"


# ignored: as a shell script's background job starts (and a test runner started by one); a signal before the
# worker's own handler is in place must still stop it, not leave it running until its bootstrap fails.
@pytest.mark.parametrize("sigint", ["SIG_DFL", "SIG_IGN"], ids=["sigint-default", "sigint-ignored"])
@pytest.mark.parametrize("command, after_s", [
    (["worker"], 0.0), (["worker"], 0.1), (["worker"], 0.3), (["worker", "--otel"], 0.3), (["bridge"], 0.3),
], ids=["worker-at-once", "worker-0.1s", "worker-0.3s", "worker-otel", "bridge"])
def test_ctrl_c_while_a_worker_starts_is_a_clean_stop(command: list[str], after_s: float, sigint: str) -> None:
    """SIGINT while `loopwarden worker` (or the bridge) starts, its broker accepting connections and never
    answering, is a clean stop at once: exit 0, no traceback, no connection error, no wait for the watchdog;
    also when the process starts with SIGINT ignored."""
    import signal
    import socket
    import time

    with socket.socket() as silent:  # a broker that accepts connections and never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        # The default watchdog (30 s): a start that waited out its client's bootstrap would end by it (exit 3), or
        # by the client's own timeout with a connection error (exit 1).
        env = {k: v for k, v in os.environ.items() if k != "LOOPWARDEN_SHUTDOWN_TIMEOUT_S"}
        # The CLI started with SIGINT as `sigint` says, whatever this process has (exec keeps an ignored signal).
        started = (f"import os, signal, sys; signal.signal(signal.SIGINT, signal.{sigint}); "
                   "os.execv(sys.executable, [sys.executable, *sys.argv[1:]])")
        proc = subprocess.Popen([sys.executable, "-c", started, "-m", "loopwarden.cli", *command, "--web-port", "0",
                                 "--broker", f"127.0.0.1:{silent.getsockname()[1]}"], stderr=subprocess.PIPE, text=True,
                                env=env)
        first = proc.stderr.readline()
        assert first.startswith(f"loopwarden {command[0]}: broker="), first
        time.sleep(after_s)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert "cannot connect" not in err and "did not stop" not in err, err
    # 0: stopped by the process's own handler; 130: the signal came before it was installed, and the CLI said
    # "interrupted" (a Ctrl-C's usual status), which is as clean.
    assert proc.returncode in (0, 130), err
