"""Serve an aiohttp app with limits on what a client can hold: header time, header bytes, connections.

aiohttp bounds each header line (``max_line_size``, ``max_field_size``) and their count
(``max_headers``), but not a request's header block as a whole (128 headers of 8 KB
pass), nor how long a client may take to send it, nor how many connections are open:
400 connections that never finish their headers are held for ever. Its public API has
no option for these three, so we do not patch it: we serve the app's public
low-level :class:`aiohttp.web.Server` (``runner.server``, documented as a protocol
factory for ``loop.create_server``) through :class:`GuardedConnection`, a plain
asyncio protocol in front of aiohttp's, which passes every byte through unchanged and

- closes a connection whose request headers are not complete within
  ``http_header_timeout_s`` of their first byte (or of the connection opening),
  with ``408 Request Timeout``;
- refuses a request whose header block exceeds ``http_max_header_bytes``
  (``431 Request Header Fields Too Large``) before aiohttp has buffered more;
- answers ``503`` and closes at once a connection beyond ``http_max_connections``.

After a request whose headers announce a body (``Content-Length`` or
``Transfer-Encoding``) the guard stands aside for the rest of that connection (our
routes take no bodies; aiohttp's own limits apply). Idle keep-alive connections are
closed by aiohttp after ``KEEPALIVE_S``.
"""

from __future__ import annotations

import asyncio
import logging

from aiohttp import web

log = logging.getLogger("loopwarden.http")
KEEPALIVE_S = 60.0
_END = b"\r\n\r\n"


def _answer(status: str, text: str) -> bytes:
    body = f'{{"error":"{text}"}}'.encode()
    return (f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
            "Connection: close\r\n\r\n").encode() + body


class Limits:
    """The three limits and the live connections they count."""

    def __init__(self, header_timeout_s: float, max_header_bytes: int, max_connections: int) -> None:
        self.header_timeout_s = header_timeout_s
        self.max_header_bytes = max_header_bytes
        self.max_connections = max_connections
        self.live: set[GuardedConnection] = set()
        self.refused = {"timeout": 0, "header_size": 0, "connections": 0}


class GuardedConnection(asyncio.Protocol):
    """One client connection: the limits, in front of aiohttp's request handler (``inner``)."""

    def __init__(self, inner: asyncio.Protocol, limits: Limits) -> None:
        self.inner = inner
        self.limits = limits
        self.transport: asyncio.Transport | None = None
        self.guarding = True  # False once a request with a body went through: pass-through
        self.header = bytearray()  # the current request's header bytes so far
        self.timer: asyncio.TimerHandle | None = None
        self.passed = False  # inner saw connection_made

    # -- asyncio.Protocol -----------------------------------------------------------------
    def connection_made(self, transport) -> None:
        self.transport = transport
        limits = self.limits
        if len(limits.live) >= limits.max_connections:
            limits.refused["connections"] += 1
            transport.write(_answer("503 Service Unavailable", "too many connections"))
            transport.close()
            return
        limits.live.add(self)
        self.passed = True
        self.inner.connection_made(transport)
        self._arm()

    def data_received(self, data: bytes) -> None:
        if not self.passed or self.transport is None or self.transport.is_closing():
            return
        if self.guarding:
            if self.timer is None:
                self._arm()  # the first byte of the next request on a kept-alive connection
            seen = len(self.header)
            self.header += data
            end = self.header.find(_END, max(0, seen - 3))
            block = len(self.header) if end < 0 else end + 4
            if block > self.limits.max_header_bytes:
                self.limits.refused["header_size"] += 1
                self._refuse("431 Request Header Fields Too Large",
                             f"request headers over {self.limits.max_header_bytes} bytes")
                return
            if end >= 0:
                self._disarm()
                head, rest = bytes(self.header[:block]).lower(), self.header[block:]
                self.header = bytearray()
                if b"\r\ncontent-length:" in head and b"\r\ncontent-length: 0\r\n" not in head \
                        or b"\r\ntransfer-encoding:" in head:
                    self.guarding = False
                elif rest:
                    self.inner.data_received(data[:len(data) - len(rest)])
                    self.data_received(bytes(rest))  # the next pipelined request
                    return
        self.inner.data_received(data)

    def eof_received(self):
        return self.inner.eof_received() if self.passed else None

    def connection_lost(self, exc) -> None:
        self._disarm()
        self.limits.live.discard(self)
        if self.passed:
            self.inner.connection_lost(exc)

    def pause_writing(self) -> None:
        if self.passed:
            self.inner.pause_writing()

    def resume_writing(self) -> None:
        if self.passed:
            self.inner.resume_writing()

    # -- the timer --------------------------------------------------------------------------
    def _arm(self) -> None:
        self.timer = asyncio.get_running_loop().call_later(self.limits.header_timeout_s, self._timed_out)

    def _disarm(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _timed_out(self) -> None:
        self.timer = None
        self.limits.refused["timeout"] += 1
        self._refuse("408 Request Timeout", f"request headers not complete within {self.limits.header_timeout_s:g} s")

    def _refuse(self, status: str, text: str) -> None:
        self._disarm()
        self.guarding = False
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(_answer(status, text))
            self.transport.close()


class GuardedSite:
    """An app served on host:port with :class:`Limits`; ``await site.cleanup()`` closes it."""

    def __init__(self, runner: web.AppRunner, server: asyncio.AbstractServer, limits: Limits) -> None:
        self.runner = runner
        self.server = server
        self.limits = limits
        self._background: list[tuple[asyncio.Task, object]] = []

    def also_run(self, coro, stop) -> None:
        """Run ``coro`` beside the server; :meth:`cleanup` calls ``stop()`` and waits for it."""
        task = asyncio.ensure_future(coro)
        task.add_done_callback(_log_failure)
        self._background.append((task, stop))

    @property
    def port(self) -> int:
        return self.server.sockets[0].getsockname()[1]

    async def cleanup(self) -> None:
        for task, stop in self._background:
            stop()
            task.cancel()
        await asyncio.gather(*(task for task, _ in self._background), return_exceptions=True)
        self.server.close()
        await self.runner.cleanup()  # aiohttp shuts its handlers (and so their connections) down


def _log_failure(task: asyncio.Task) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("%s failed", task.get_coro(), exc_info=task.exception())


async def serve_guarded(app: web.Application, host: str, port: int, config) -> GuardedSite:
    """Serve ``app`` on host:port with the config's ``http_*`` limits."""
    runner = web.AppRunner(app, access_log=None, keepalive_timeout=KEEPALIVE_S)
    await runner.setup()
    factory = runner.server  # aiohttp's documented low-level server: a protocol factory
    limits = Limits(config.http_header_timeout_s, config.http_max_header_bytes, config.http_max_connections)
    server = await asyncio.get_running_loop().create_server(
        lambda: GuardedConnection(factory(), limits), host, port)
    return GuardedSite(runner, server, limits)
