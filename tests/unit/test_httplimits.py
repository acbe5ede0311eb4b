"""The HTTP guard in front of aiohttp (loopwarden.api.httplimits), on real sockets, without Kafka."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from aiohttp import web

from loopwarden.api.httplimits import serve_guarded

LIMITS = SimpleNamespace(http_header_timeout_s=0.5, http_max_header_bytes=2048, http_max_connections=3)


async def _site():
    app = web.Application()

    async def hello(request: web.Request) -> web.Response:
        return web.Response(text="hi")

    app.router.add_get("/", hello)
    app.router.add_post("/echo", _echo)
    return await serve_guarded(app, "127.0.0.1", 0, LIMITS)


async def _echo(request: web.Request) -> web.Response:
    return web.Response(body=await request.read())


async def _talk(port: int, data: bytes, wait_s: float = 3) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(data)
    try:
        return await asyncio.wait_for(reader.read(), wait_s)
    except ConnectionResetError:
        return b"reset"
    finally:
        writer.close()


def test_pipelined_requests_bodies_and_limits() -> None:
    """Two pipelined GETs in one packet both answer; a request with a body passes through whole; a
    header block over the cap gets 431; a connection over the maximum 503; silence 408 in time."""

    async def go() -> None:
        site = await _site()
        port = site.port
        try:
            two = await _talk(port, b"GET / HTTP/1.1\r\nHost: x\r\n\r\nGET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            assert two.count(b"HTTP/1.1 200") == 2
            body = b"x" * 5000  # larger than the header cap: a body is not headers
            echoed = await _talk(port, b"POST /echo HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: %d\r\n\r\n"
                                 % len(body) + body)
            assert echoed.startswith(b"HTTP/1.1 200") and echoed.endswith(body)
            big = await _talk(port, b"GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 3000 + b"\r\n\r\n")
            assert big.startswith(b"HTTP/1.1 431") or big == b"reset"
            held = [await asyncio.open_connection("127.0.0.1", port) for _ in range(3)]
            await asyncio.sleep(0.05)
            over = await _talk(port, b"")
            assert over.startswith(b"HTTP/1.1 503")
            loop = asyncio.get_running_loop()
            began = loop.time()
            answers = [await asyncio.wait_for(r.read(), 3) for r, _w in held]
            assert all(a.startswith(b"HTTP/1.1 408") for a in answers) and loop.time() - began < 1.5
            for _r, w in held:
                w.close()
        finally:
            await site.cleanup()

    asyncio.run(go())
