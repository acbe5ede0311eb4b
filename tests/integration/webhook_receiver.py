"""A real local HTTPS receiver for `loopwarden actions` tests: a self-signed certificate made here, an aiohttp
server on its own event loop thread, that can answer 500, go down and come back on the same port."""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import json
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from loopwarden.actions import SIGNATURE_HEADER, verify


def self_signed(directory: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 and localhost, and its key (PEM files)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                                        x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = directory / "cert.pem", directory / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path


@dataclass(frozen=True)
class Request:
    at: float  # wall clock, seconds
    action_id: str
    header_id: str | None
    body: bytes
    signed: bool
    status: int


class Receiver:
    """Records every POST; answers ``status`` (200 by default) after ``delay_s``."""

    def __init__(self, directory: Path, secret: bytes, port: int) -> None:
        import ssl

        self.cert, key = self_signed(directory)
        self.secret, self.port = secret, port
        self.status, self.delay_s = 200, 0.0
        self.requests: list[Request] = []
        self._ssl = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self._ssl.load_cert_chain(self.cert, key)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self._runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}/actions"

    async def _handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        status = self.status
        self.requests.append(Request(time.time(), json.loads(body)["action_id"],
                                     request.headers.get("X-Loopwarden-Action-Id"), body,
                                     verify(self.secret, body, request.headers.get(SIGNATURE_HEADER)), status))
        return web.Response(status=status, text="ok" if status == 200 else "no")

    async def _up(self) -> None:
        app = web.Application()
        app.router.add_post("/actions", self._handle)
        self._runner = web.AppRunner(app, shutdown_timeout=0.1)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port, ssl_context=self._ssl, reuse_address=True).start()

    async def _down(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    def _call(self, coro) -> None:
        asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout=30)

    def up(self) -> "Receiver":
        self._call(self._up())
        return self

    def down(self) -> None:
        self._call(self._down())

    def close(self) -> None:
        self.down()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)

    def delivered(self) -> dict[str, Request]:
        """The first 2xx request of each action id."""
        out: dict[str, Request] = {}
        for r in list(self.requests):
            if r.status == 200:
                out.setdefault(r.action_id, r)
        return out
