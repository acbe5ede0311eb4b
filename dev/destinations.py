"""Real destinations for the verifier's tests: an HTTPS server with a test CA, a PostgreSQL cluster.

The CA and the server certificate are made here with ``cryptography``; the PostgreSQL cluster is
Debian's ``postgresql`` package (``make postgresql`` installs it), started with ``initdb`` /
``pg_ctl`` in a temporary directory as an unprivileged user (PostgreSQL refuses to run as root).
"""

from __future__ import annotations

import asyncio
import datetime
import glob
import ipaddress
import os
import pwd
import shutil
import socket
import ssl
import subprocess
import tempfile
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_ca_and_server_cert(directory: Path, host: str = "localhost") -> tuple[Path, Path, Path]:
    """A test CA and a server certificate for ``host`` (and 127.0.0.1) it signed: (ca.pem, cert.pem, key.pem)."""
    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "loopwarden test CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
          .not_valid_after(now + datetime.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
                                       key_encipherment=False, data_encipherment=False, key_agreement=False,
                                       encipher_only=False, decipher_only=False), critical=True)
          .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host)]))
            .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(host), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256()))
    paths = directory / "ca.pem", directory / "cert.pem", directory / "key.pem"
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return paths


def server_ssl(cert: Path, key: Path) -> ssl.SSLContext:
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(cert, key)
    return ctx


def pg_bin(name: str) -> str:
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}")) or ([shutil.which(name)] if shutil.which(name) else [])
    if not found:
        raise RuntimeError(f"PostgreSQL's {name} not found: run `make postgresql` (Debian's postgresql package)")
    return found[-1]


class PostgresCluster:
    """A throwaway PostgreSQL cluster on a free port, password (SCRAM) authentication for ``user``."""

    def __init__(self, user: str = "verifier", password: str = "s3cret-pw", tls: tuple[Path, Path] | None = None) -> None:
        """``tls``: (certificate, key) PEM files: the server then offers TLS with them (ssl=on)."""
        self.user, self.password, self.tls = user, password, tls
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="lw-pg-"))
        self.data = self.dir / "data"
        self.run_as: list[str] = []
        if os.geteuid() == 0:  # PostgreSQL refuses root: run its binaries as nobody
            nobody = pwd.getpwnam("nobody")
            os.chown(self.dir, nobody.pw_uid, nobody.pw_gid)
            self.run_as = ["runuser", "-u", "nobody", "--"]
            self._owner = (nobody.pw_uid, nobody.pw_gid)
        else:
            self._owner = None

    def _run(self, *args: str, **kw) -> subprocess.CompletedProcess:
        return subprocess.run([*self.run_as, *args], check=True, capture_output=True, text=True, cwd=self.dir, **kw)

    def start(self) -> "PostgresCluster":
        pwfile = self.dir / "pw"
        pwfile.write_text(self.password + "\n")
        if self._owner:
            os.chown(pwfile, *self._owner)
        self._run(pg_bin("initdb"), "-D", str(self.data), "-U", self.user, f"--pwfile={pwfile}",
                  "--auth=scram-sha-256", "-E", "UTF8", "--no-sync")
        options = f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c fsync=off"
        if self.tls is not None:  # the server reads its key only when it is private to its user
            for name, src in zip(("server.crt", "server.key"), self.tls):
                shutil.copyfile(src, self.dir / name)
                os.chmod(self.dir / name, 0o600)
                if self._owner:
                    os.chown(self.dir / name, *self._owner)
            options += f" -c ssl=on -c ssl_cert_file={self.dir / 'server.crt'} -c ssl_key_file={self.dir / 'server.key'}"
        self._run(pg_bin("pg_ctl"), "-D", str(self.data), "-l", str(self.dir / "log"), "-w", "-t", "60",
                  "-o", options, "start")
        return self

    def psql(self, sql: str) -> str:
        env = {**os.environ, "PGPASSWORD": self.password}
        return self._run(pg_bin("psql"), "-h", "127.0.0.1", "-p", str(self.port), "-U", self.user, "-d", "postgres",
                         "-v", "ON_ERROR_STOP=1", "-qAt", "-c", sql, env=env).stdout

    def stop(self) -> None:
        try:
            self._run(pg_bin("pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "stop")
        except subprocess.CalledProcessError:
            pass
        shutil.rmtree(self.dir, ignore_errors=True)


async def start_https(routes, cert: Path, key: Path):
    """An aiohttp HTTPS server on localhost and a free port; returns (runner, port)."""
    from aiohttp import web

    app = web.Application()
    app.add_routes(routes)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
    await runner.setup()
    port = free_port()
    site = web.TCPSite(runner, "127.0.0.1", port, ssl_context=server_ssl(cert, key))
    await site.start()
    return runner, port


async def endless(request):
    """A body that never ends (10 GB announced): the verifier must cut it at its limit."""
    from aiohttp import web

    resp = web.StreamResponse(headers={"Content-Length": str(10 * 1024**3)})
    await resp.prepare(request)
    chunk = b"\0" * 65536
    try:
        for _ in range(10 * 1024**3 // 65536):
            await resp.write(chunk)
    except (ConnectionResetError, asyncio.CancelledError):
        pass
    return resp
