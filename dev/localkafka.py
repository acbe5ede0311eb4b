"""Fetch and run a real single-node Apache Kafka (KRaft) broker, without Docker.

The broker's jars come from Maven Central through ``dev/kafka/pom.xml``
(``fetch()``); the broker runs as a plain ``java`` subprocess bound to
127.0.0.1, as one combined broker+controller node configured from the template
``dev/kafka/server.properties``.

Library use (e.g. a pytest fixture)::

    from dev.localkafka import LocalKafka
    with LocalKafka(tmp_path / "kafka") as kafka:
        use(kafka.bootstrap)            # "127.0.0.1:<port>"

Command line (from any directory)::

    python -m dev.localkafka fetch
    python -m dev.localkafka run   --port 9092 --dir .kafka   # foreground
    python -m dev.localkafka start --port 9092 --dir .kafka   # background
    python -m dev.localkafka stop  --dir .kafka

Readiness is decided by talking Kafka's protocol, not by a TCP connect or a log
line: the broker only accepts client connections once it is registered and
unfenced, and ``start()`` further requires an ApiVersions answer without error
and a Metadata answer that lists this broker.

Only the standard library is used. Environment:

* ``LOOPWARDEN_KAFKA_LIB`` - directory of the broker's jars (default
  ``<repo>/dev/kafka/lib``); ``fetch()`` fills it.
* ``LOOPWARDEN_KAFKA_JAVA`` - java executable (default: ``java`` on PATH).
* ``LOOPWARDEN_KAFKA_JVM_OPTS`` - extra JVM flags for the broker (space-separated).
"""

from __future__ import annotations

import argparse
import atexit
import base64
import hashlib
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

__all__ = [
    "REPO_ROOT",
    "KAFKA_DEV_DIR",
    "LocalKafka",
    "LocalKafkaError",
    "fetch",
    "free_port",
    "port_free",
    "lib_dir",
    "probe",
    "stop_dir",
]

REPO_ROOT = Path(__file__).resolve().parent.parent
KAFKA_DEV_DIR = REPO_ROOT / "dev" / "kafka"
POM = KAFKA_DEV_DIR / "pom.xml"
PROPS_TEMPLATE = KAFKA_DEV_DIR / "server.properties"
LOG4J_CONFIG = KAFKA_DEV_DIR / "log4j2.properties"

HOST = "127.0.0.1"
_STAMP = ".fetched"  # in the lib dir: hash of the pom the jars came from
_PROPS = "server.properties"
_DATA = "data"
_LOG = "kafka.log"
_PID = "kafka.pid"
_BOOTSTRAP = "bootstrap"

# JVM flags besides -Xmx: those of Kafka's kafka-run-class.sh (G1, short pauses),
# plus a small initial heap and C1-only JIT (TieredStopAtLevel=1): on 2 cores
# that starts the broker ~30% faster with ~40 MB less RSS, at some cost in peak
# throughput. For benchmarks set LOOPWARDEN_KAFKA_JVM_OPTS=-XX:TieredStopAtLevel=4
# (later flags win).
DEFAULT_JVM_ARGS = (
    "-Xms64m", "-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20",
    "-XX:InitiatingHeapOccupancyPercent=35", "-XX:+ExplicitGCInvokesConcurrent",
    "-XX:TieredStopAtLevel=1", "-Djava.awt.headless=true",
)


class LocalKafkaError(RuntimeError):
    """Fetching, starting or stopping the local broker failed."""


# --------------------------------------------------------------------- fetch


def lib_dir() -> Path:
    """Directory holding the broker's jars (``$LOOPWARDEN_KAFKA_LIB`` or dev/kafka/lib)."""
    env = os.environ.get("LOOPWARDEN_KAFKA_LIB")
    return Path(env).expanduser().resolve() if env else KAFKA_DEV_DIR / "lib"


def _pom_hash() -> str:
    return hashlib.sha256(POM.read_bytes()).hexdigest()[:16]


def _jars_present(lib: Path) -> bool:
    return (
        lib.is_dir()
        and any(lib.glob("kafka_2.13-*.jar"))
        and any(lib.glob("kafka-server-*.jar"))
        and any(lib.glob("log4j-core-*.jar"))
    )


def _fetch_command(lib: Path) -> list[str]:
    return [
        "mvn", "-q", "-B", "-f", str(POM),
        "dependency:copy-dependencies", f"-Dkafka.lib.dir={lib}",
    ]


def fetch(force: bool = False, quiet: bool = True) -> Path:
    """Make sure the broker's jars are in ``lib_dir()``; run Maven if they are not.

    Idempotent: does nothing when the jars are there and were fetched with the
    current ``dev/kafka/pom.xml`` (a changed pom, e.g. another Kafka version,
    triggers a clean re-fetch). Returns the lib directory.
    """
    lib = lib_dir()
    stamp = lib / _STAMP
    want = _pom_hash()
    if not force and _jars_present(lib):
        have = stamp.read_text().strip() if stamp.exists() else None
        # A lib dir without stamp (filled by hand / another tool) is trusted.
        if have is None or have == want:
            return lib
    cmd = _fetch_command(lib)
    shown = " ".join(cmd)
    mvn = shutil.which("mvn")
    if mvn is None:
        raise LocalKafkaError(
            f"Maven ('mvn') is not on PATH; it is needed to fetch the Kafka broker jars.\n"
            f"Install it (e.g. 'apt-get install maven') and run: {shown}\n"
            f"or point LOOPWARDEN_KAFKA_LIB at a directory holding the jars."
        )
    cmd[0] = mvn
    if lib.is_dir():  # never mix jars of two Kafka versions
        for jar in lib.glob("*.jar"):
            jar.unlink()
    lib.mkdir(parents=True, exist_ok=True)
    if not quiet:
        print(f"fetching Kafka broker jars: {shown}", file=sys.stderr, flush=True)
    res = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if res.returncode != 0 or not _jars_present(lib):
        tail = "\n".join(res.stdout.strip().splitlines()[-30:])
        raise LocalKafkaError(
            f"fetching the Kafka broker jars failed (exit {res.returncode}): {shown}\n{tail}"
        )
    stamp.write_text(want + "\n")
    return lib


# ------------------------------------------------------------ kafka protocol


def free_port(host: str = HOST, exclude: tuple[int, ...] = ()) -> int:
    """A TCP port on ``host`` that is free right now."""
    for _ in range(50):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((host, 0))
            port = s.getsockname()[1]
        if port not in exclude:
            return port
    raise LocalKafkaError("could not find a free TCP port")


def port_free(port: int, host: str = HOST) -> bool:
    """Whether the broker could listen on ``port`` now.

    Bound with SO_REUSEADDR, as the JVM binds its server sockets on Linux and macOS: connections
    of a broker just killed linger in TIME_WAIT for ~60 s and do not stop a new listener; only a
    socket that listens there does."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("connection closed by broker")
        buf += chunk
    return bytes(buf)


def _request(sock: socket.socket, api_key: int, version: int, corr: int, body: bytes) -> bytes:
    """Send one non-flexible request (header v1) and return the response body."""
    client_id = b"loopwarden-localkafka"
    header = struct.pack(">hhih", api_key, version, corr, len(client_id)) + client_id
    msg = header + body
    sock.sendall(struct.pack(">i", len(msg)) + msg)
    (size,) = struct.unpack(">i", _recv_exact(sock, 4))
    resp = _recv_exact(sock, size)
    (got,) = struct.unpack(">i", resp[:4])
    if got != corr:
        raise ConnectionError(f"correlation id mismatch ({got} != {corr})")
    return resp[4:]


def probe(host: str, port: int, timeout: float = 2.0) -> bool:
    """True if a Kafka broker at host:port answers ApiVersions and Metadata.

    The Metadata answer must list a broker at ``port``: a KRaft broker shows up
    there only once it is registered and unfenced, i.e. able to serve clients.
    """
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.settimeout(timeout)
            # ApiVersions v0 (api key 18): every broker version answers it.
            body = _request(sock, 18, 0, 1, b"")
            (err, n) = struct.unpack(">hi", body[:6])
            if err != 0:
                return False
            versions = {}
            for i in range(n):
                key, lo, hi = struct.unpack(">hhh", body[6 + 6 * i: 12 + 6 * i])
                versions[key] = (lo, hi)
            if 3 not in versions:
                return False
            lo, hi = versions[3]
            # Metadata (key 3): use a non-flexible version, 4..8 (v0-v3 are gone
            # from Kafka 4). If a future broker has none, ApiVersions must do.
            ver = min(hi, 8)
            if ver < max(lo, 4):
                return True
            req = struct.pack(">i?", 0, False)  # topics=[] , allow_auto_topic_creation
            if ver >= 8:
                req += struct.pack(">??", False, False)  # authorized operations
            body = _request(sock, 3, ver, 2, req)
            off = 4  # throttle_time_ms
            (nb,) = struct.unpack(">i", body[off: off + 4])
            off += 4
            for _ in range(nb):
                _node, hlen = struct.unpack(">ih", body[off: off + 6])
                off += 6 + hlen
                (bport, rlen) = struct.unpack(">ih", body[off: off + 6])
                off += 6 + max(rlen, 0)
                if bport == port:
                    return True
            return False
    except (OSError, ConnectionError, struct.error):
        return False


# ------------------------------------------------------------------- broker


def _cluster_id() -> str:
    """A random Kafka cluster id: 16 random bytes, url-safe base64 without padding."""
    while True:
        cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cid.startswith("-"):  # would look like an option on a command line
            return cid


def _read_props(path: Path) -> dict[str, str]:
    props = {}
    if path.exists():
        for line in path.read_text().splitlines():
            line = line.strip()
            if line and not line.startswith("#") and "=" in line:
                k, v = line.split("=", 1)
                props[k.strip()] = v.strip()
    return props


def _size_mb(size: str) -> float:
    """'512m' / '1g' / '65536k' / '1073741824' -> megabytes (as java reads -Xmx)."""
    size = size.strip().lower()
    mult = {"k": 1 / 1024, "m": 1, "g": 1024, "t": 1024 * 1024}
    if size and size[-1] in mult:
        return float(size[:-1]) * mult[size[-1]]
    return float(size) / (1024 * 1024)


def _tail(path: Path, lines: int = 40) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])


_running: "set[LocalKafka]" = set()


@atexit.register
def _stop_all() -> None:
    for k in list(_running):
        try:
            k.stop(timeout_s=10)
        except Exception:  # noqa: BLE001 - best effort at interpreter exit
            pass


def _pdeathsig_preexec():
    """A preexec_fn asking Linux to SIGTERM the broker when its parent dies, or None."""
    if not sys.platform.startswith("linux"):
        return None
    try:  # resolved here, in the parent: the child only makes the call
        import ctypes

        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None

    def preexec() -> None:  # pragma: no cover - runs in the child
        prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG

    return preexec


class LocalKafka:
    """One single-node Kafka (KRaft, broker+controller) in ``workdir``.

    ``workdir`` gets ``server.properties`` (rendered), ``data/`` (log.dirs),
    ``kafka.log`` (the broker's stdout/stderr), ``format.log``, ``kafka.pid``
    and, while ready, ``bootstrap``. Existing data in ``workdir`` is reused
    (same cluster, topics and offsets) unless ``clean=True`` (wipes ``data/``).
    ``port`` / ``controller_port`` of None pick free ports. ``overrides`` adds
    or replaces broker properties; ``jvm_args`` replaces DEFAULT_JVM_ARGS.
    ``die_with_parent`` (default: when started from the main thread) makes the
    kernel SIGTERM the broker if this Python process dies without stopping it.
    """

    def __init__(
        self,
        workdir: Path | str,
        port: int | None = None,
        heap: str = "512m",
        *,
        controller_port: int | None = None,
        overrides: dict[str, object] | None = None,
        clean: bool = False,
        die_with_parent: bool | None = None,
        jvm_args: list[str] | None = None,
        format_args: list[str] | None = None,
    ) -> None:
        self.workdir = Path(workdir).expanduser().resolve()
        # extra arguments of `kafka-storage format` at the first start (e.g. --add-scram for SASL/SCRAM users)
        self.format_args = list(format_args or [])
        self.heap = heap
        self.overrides = {k: str(v) for k, v in (overrides or {}).items()}
        self.clean = clean
        self.die_with_parent = die_with_parent
        self.jvm_args = list(jvm_args) if jvm_args is not None else list(DEFAULT_JVM_ARGS)
        self._want_port = port
        self._want_controller_port = controller_port
        self.port: int | None = port
        self.controller_port: int | None = controller_port
        self.cluster_id: str | None = None
        self.proc: subprocess.Popen | None = None
        self.started_in_s: float | None = None

    # -- paths / properties
    @property
    def props_path(self) -> Path:
        return self.workdir / _PROPS

    @property
    def data_dir(self) -> Path:
        return self.workdir / _DATA

    @property
    def log_path(self) -> Path:
        return self.workdir / _LOG

    @property
    def pid_path(self) -> Path:
        return self.workdir / _PID

    @property
    def bootstrap(self) -> str:
        if self.port is None:
            raise LocalKafkaError("broker not started: no port chosen yet")
        return f"{HOST}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, lines: int = 40) -> str:
        return _tail(self.log_path, lines)

    # -- lifecycle
    def _choose_ports(self) -> None:
        old = _read_props(self.props_path) if not self.clean else {}
        old_cport = old.get("controller.quorum.bootstrap.servers", "").rpartition(":")[2]
        port = self._want_port
        if port is None:
            port = free_port()
        cport = self._want_controller_port
        if cport is None:
            # Reuse the controller port a previous run of this workdir had: it
            # is recorded in the KRaft voter set written at format time.
            if old_cport.isdigit() and int(old_cport) != port and port_free(int(old_cport)):
                cport = int(old_cport)
            else:
                cport = free_port(exclude=(port,))
        if port == cport:
            raise LocalKafkaError("broker and controller ports must differ")
        for p, what in ((port, "broker"), (cport, "controller")):
            if not port_free(p):
                raise LocalKafkaError(f"{what} port {HOST}:{p} is already in use")
        self.port, self.controller_port = port, cport

    def _render_props(self) -> None:
        text = PROPS_TEMPLATE.read_text()
        text = (
            text.replace("@BROKER_PORT@", str(self.port))
            .replace("@CONTROLLER_PORT@", str(self.controller_port))
            .replace("@LOG_DIR@", str(self.data_dir))
        )
        if self.overrides:
            text += "\n# overrides from LocalKafka(overrides=...)\n"
            text += "".join(f"{k}={v}\n" for k, v in self.overrides.items())
        left = re.findall(r"^[^#\n]*(@[A-Z_]+@)", text, flags=re.M)
        if left:
            raise LocalKafkaError(f"unfilled placeholder(s) {left} in {PROPS_TEMPLATE}")
        self.props_path.write_text(text)

    def _java(self) -> str:
        java = os.environ.get("LOOPWARDEN_KAFKA_JAVA") or shutil.which("java")
        if not java:
            raise LocalKafkaError("'java' (17 or newer) is not on PATH; Kafka 4 needs it")
        return java

    def _classpath(self, lib: Path) -> str:
        return f"{lib}{os.sep}*"  # java expands the wildcard itself (no shell)

    def _format(self, java: str, lib: Path) -> None:
        meta = self.data_dir / "meta.properties"
        if meta.exists():
            self.cluster_id = _read_props(meta).get("cluster.id")
            return
        self.cluster_id = _cluster_id()
        cmd = [
            java, "-Xmx256m", f"-Dlog4j2.configurationFile={LOG4J_CONFIG}",
            "-cp", self._classpath(lib), "kafka.tools.StorageTool",
            "format", "--standalone", "-t", self.cluster_id, "-c", str(self.props_path), *self.format_args,
        ]
        flog = self.workdir / "format.log"
        with open(flog, "w") as out:
            res = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=self.workdir)
        if res.returncode != 0:
            raise LocalKafkaError(
                f"formatting Kafka storage failed (exit {res.returncode}): {' '.join(cmd)}\n"
                f"--- {flog} (tail) ---\n{_tail(flog)}"
            )

    def start(self, timeout_s: float = 60) -> "LocalKafka":
        """Format storage if needed, launch the broker, and wait until it serves clients."""
        if self.running():
            raise LocalKafkaError(f"broker already running (pid {self.pid})")
        t0 = time.monotonic()
        lib = fetch()
        java = self._java()
        self.workdir.mkdir(parents=True, exist_ok=True)
        other = _live_pid(self.workdir)
        if other:
            raise LocalKafkaError(
                f"a broker (pid {other}) already runs in {self.workdir}; stop it first"
            )
        if self.clean:  # only what we made: workdir may be a user's directory
            shutil.rmtree(self.data_dir, ignore_errors=True)
        self._choose_ports()
        self._render_props()
        self._format(java, lib)
        jvm_args = self.jvm_args
        if _size_mb(self.heap) < 64:  # -Xms64m must not exceed -Xmx
            jvm_args = [a for a in jvm_args if not a.startswith("-Xms")]
        cmd = [
            java, f"-Xmx{self.heap}", *jvm_args,
            *os.environ.get("LOOPWARDEN_KAFKA_JVM_OPTS", "").split(),
            f"-Dlog4j2.configurationFile={LOG4J_CONFIG}",
            "-cp", self._classpath(lib), "kafka.Kafka", str(self.props_path),
        ]
        die = self.die_with_parent
        if die is None:
            die = threading.current_thread() is threading.main_thread()
        with open(self.log_path, "w") as out:
            self.proc = subprocess.Popen(
                cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                cwd=self.workdir,
                start_new_session=True,  # a terminal's Ctrl-C goes to us, not java
                preexec_fn=_pdeathsig_preexec() if die else None,
            )
        _running.add(self)
        self.pid_path.write_text(f"{self.proc.pid}\n")
        deadline = t0 + timeout_s
        while True:
            code = self.proc.poll()
            if code is not None:
                self._forget()
                raise LocalKafkaError(
                    f"Kafka broker exited with code {code} before it was ready\n"
                    f"--- {self.log_path} (tail) ---\n{self.log_tail()}"
                )
            if probe(HOST, self.port, timeout=1.0):
                break
            if time.monotonic() > deadline:
                tail = self.log_tail()
                self.stop(timeout_s=5)
                raise LocalKafkaError(
                    f"Kafka broker at {self.bootstrap} not ready after {timeout_s:.0f}s\n"
                    f"--- {self.log_path} (tail) ---\n{tail}"
                )
            time.sleep(0.1)
        self.started_in_s = time.monotonic() - t0
        (self.workdir / _BOOTSTRAP).write_text(self.bootstrap + "\n")
        return self

    def stop(self, timeout_s: float = 20) -> int | None:
        """SIGTERM the broker (a clean shutdown), SIGKILL it after ``timeout_s``.

        Returns the broker's exit code (143 = 128+SIGTERM after a clean
        shutdown, -9 if it had to be killed), or None if it was not started.
        """
        proc = self.proc
        if proc is None:
            return None
        if proc.poll() is None:
            try:
                proc.send_signal(signal.SIGTERM)
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self._forget()
        return proc.returncode

    def detach(self) -> None:
        """Leave the broker running after this process exits (used by CLI ``start``)."""
        _running.discard(self)
        self.proc = None

    def _forget(self) -> None:
        _running.discard(self)
        for p in (self.pid_path, self.workdir / _BOOTSTRAP):
            try:
                p.unlink()
            except FileNotFoundError:
                pass
        self.proc = None if self.proc is None or self.proc.poll() is not None else self.proc

    def __enter__(self) -> "LocalKafka":
        return self.start() if not self.running() else self

    def __exit__(self, *exc) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = f"pid {self.pid}" if self.running() else "stopped"
        return f"LocalKafka({str(self.workdir)!r}, port={self.port}, {state})"


# ------------------------------------------------------ pid-file management


def _is_our_broker(pid: int, workdir: Path) -> bool:
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return b"kafka.Kafka" in cmdline and str(workdir / _PROPS).encode() in cmdline


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"  # a zombie is gone


def _live_pid(workdir: Path) -> int | None:
    pidfile = workdir / _PID
    try:
        pid = int(pidfile.read_text().strip())
    except (OSError, ValueError):
        return None
    return pid if _alive(pid) and _is_our_broker(pid, workdir) else None


def stop_dir(workdir: Path | str, timeout_s: float = 20) -> bool:
    """Stop the broker recorded in ``workdir/kafka.pid`` (started by CLI ``start``).

    Returns True if a broker was running. SIGTERM, then SIGKILL after ``timeout_s``.
    """
    workdir = Path(workdir).expanduser().resolve()
    pid = _live_pid(workdir)
    if pid is None:
        for p in (workdir / _PID, workdir / _BOOTSTRAP):
            if p.exists():
                p.unlink()
        return False
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    if _alive(pid):
        os.kill(pid, signal.SIGKILL)
        while _alive(pid):
            time.sleep(0.05)
    for p in (workdir / _PID, workdir / _BOOTSTRAP):
        if p.exists():
            p.unlink()
    return True


# ---------------------------------------------------------------------- CLI


def _main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m dev.localkafka",
        description="Fetch and run a local single-node Apache Kafka (KRaft) broker.",
    )
    sub = ap.add_subparsers(dest="cmd", required=True)
    f = sub.add_parser("fetch", help="download the broker jars with Maven (idempotent)")
    f.add_argument("--force", action="store_true", help="re-download even if present")
    for name, helptext in (
        ("run", "run a broker in the foreground until Ctrl-C / SIGTERM"),
        ("start", "start a broker in the background; returns once it is ready"),
    ):
        p = sub.add_parser(name, help=helptext)
        p.add_argument("--port", type=int, default=None, help="broker port (default: a free one)")
        p.add_argument("--controller-port", type=int, default=None)
        p.add_argument("--dir", default=".kafka", help="work dir (default: .kafka)")
        p.add_argument("--heap", default="512m", help="java -Xmx (default: 512m)")
        p.add_argument("--timeout", type=float, default=60.0, help="readiness timeout, s")
        p.add_argument("--clean", action="store_true", help="wipe the work dir's data first")
    s = sub.add_parser("stop", help="stop the broker started with 'start'")
    s.add_argument("--dir", default=".kafka")
    s.add_argument("--timeout", type=float, default=20.0)
    args = ap.parse_args(argv)

    try:
        if args.cmd == "fetch":
            print(fetch(force=args.force, quiet=False))
            return 0
        if args.cmd == "stop":
            was = stop_dir(args.dir, timeout_s=args.timeout)
            print("stopped" if was else f"no broker running in {args.dir}")
            return 0
        fetch(quiet=False)
        kafka = LocalKafka(
            args.dir, port=args.port, heap=args.heap,
            controller_port=args.controller_port, clean=args.clean,
            die_with_parent=(args.cmd == "run"),
        )
        if args.cmd == "start":
            kafka.start(timeout_s=args.timeout)
            kafka.detach()
            print(kafka.bootstrap, flush=True)
            return 0
        # run: foreground
        stop_evt = threading.Event()
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, lambda *_: stop_evt.set())
        kafka.start(timeout_s=args.timeout)
        print(kafka.bootstrap, flush=True)
        print(
            f"Kafka ready at {kafka.bootstrap} in {kafka.started_in_s:.1f}s "
            f"(pid {kafka.pid}, log {kafka.log_path}); Ctrl-C to stop",
            file=sys.stderr, flush=True,
        )
        while not stop_evt.is_set() and kafka.running():
            stop_evt.wait(0.5)
        if not kafka.running():
            code = kafka.proc.returncode if kafka.proc else None
            print(f"Kafka broker exited (code {code})\n{kafka.log_tail()}", file=sys.stderr)
            kafka.stop()
            return 1
        code = kafka.stop()
        clean = " (clean shutdown)" if code in (0, 128 + signal.SIGTERM) else ""
        print(f"Kafka stopped (exit {code}){clean}", file=sys.stderr)
        return 0
    except LocalKafkaError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(_main())
