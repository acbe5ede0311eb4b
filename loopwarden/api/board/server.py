"""`loopwarden board`: reads agent.health (read_committed, every partition) into a :class:`Fleet` and serves it.

Routes (aiohttp, behind the same header/size/connection limits as the worker's API):

- ``GET /`` and ``/static/*``: the page (plain HTML, CSS and JS shipped in this package;
  nothing from a CDN). They hold no data, so they answer without the token: the page asks
  for it.
- ``GET /api/snapshot?state=&agent=``: counts now and over the last hour, and the runs that
  need a person, oldest first (JSON).
- ``GET /api/runs/{run_id}``: one run's transitions with their evidence, and what to do.
- ``GET /api/stream?state=&agent=&run=``: the same as server-sent events: a ``snapshot``
  event whenever the fleet changed (at most every ``STREAM_MIN_INTERVAL_S``), and at least
  every ``STREAM_HEARTBEAT_S``; with ``run=`` each event also carries that run's page.
- ``GET /healthz``: open, for probes.

With a token configured, every ``/api/`` route needs ``Authorization: Bearer <token>``
(401 otherwise), as the worker's API. The page sends it from the browser's session storage
(``fetch`` with the header, so the stream is read with ``fetch``, not ``EventSource``, and
the token never appears in a URL).
"""

from __future__ import annotations

import asyncio
import hmac
import html
import logging
from importlib.resources import files
from pathlib import Path

import msgspec
from aiohttp import web

from loopwarden.api.board.fleet import ACTIONS, ATTENTION
from loopwarden.api.board.reader import Board, now_ms
from loopwarden.codecs import STATES
from loopwarden.config import Config
from loopwarden.api.httplimits import GuardedSite, serve_guarded

log = logging.getLogger("loopwarden.board")
STREAM_MIN_INTERVAL_S = 0.05
STREAM_HEARTBEAT_S = 15.0
STATIC = {"board.js": "application/javascript", "board.css": "text/css"}


def _json(data, status: int = 200) -> web.Response:
    return web.Response(body=msgspec.json.encode(data), status=status, content_type="application/json",
                        headers={"Cache-Control": "no-store"})


def make_app(board: Board, prefix: str = "") -> web.Application:
    """The board's routes; ``prefix``: where it is mounted (``/board`` in a worker)."""
    config = board.config
    expected = f"Bearer {config.token}".encode() if config.token else None
    page = (files("loopwarden.api.board") / "static" / "index.html").read_text()
    page = page.replace("{{DOCS}}", html.escape(config.states_doc_url)).replace(
        "{{AUTH}}", "token" if expected else "open")
    static = {name: (files("loopwarden.api.board") / "static" / name).read_bytes() for name in STATIC}

    @web.middleware
    async def auth(request: web.Request, handler):
        path = request.path[len(prefix):] if request.path.startswith(prefix) else request.path
        if expected is not None and not (path in ("/", "/healthz", "/docs/states.md") or path.startswith("/static/")):
            if not hmac.compare_digest(request.headers.get("Authorization", "").encode(), expected):
                return _json({"error": "unauthorized: send Authorization: Bearer <token>"}, status=401)
        return await handler(request)

    def filters(request: web.Request) -> tuple[str | None, str | None] | web.Response:
        state = request.query.get("state") or None
        agent = request.query.get("agent") or None
        if state is not None and state not in STATES:
            return _json({"error": f"state={state[:100]!r}: give one of {', '.join(STATES)}"}, status=400)
        if agent is not None and len(agent) > 200:
            return _json({"error": "agent: at most 200 characters"}, status=400)
        return state, agent

    async def index(request: web.Request) -> web.Response:
        return web.Response(text=page, content_type="text/html", headers={"Cache-Control": "no-store"})

    async def asset(request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if name not in static:
            raise web.HTTPNotFound()
        return web.Response(body=static[name], content_type=STATIC[name], headers={"Cache-Control": "no-cache"})

    async def healthz(request: web.Request) -> web.Response:
        return _json({"status": "ok", "caught_up": board.ready, "runs": len(board.fleet.runs)})

    async def snapshot(request: web.Request) -> web.Response:
        got = filters(request)
        if isinstance(got, web.Response):
            return got
        return _json(board.fleet.snapshot(now_ms(), state=got[0], agent=got[1]))

    async def run(request: web.Request) -> web.Response:
        doc = board.fleet.run_document(request.match_info["run_id"], now_ms())
        if doc is None:
            return _json({"error": "run not on the board (never seen, or aged out)"}, status=404)
        return _json(doc)

    async def stream(request: web.Request) -> web.StreamResponse:
        got = filters(request)
        if isinstance(got, web.Response):
            return got
        state, agent = got
        run_id = request.query.get("run") or None
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-store",
                                               "X-Accel-Buffering": "no"})
        await response.prepare(request)
        sent = -1
        try:
            while not board.stopping.is_set():
                if board.fleet.version == sent:
                    await board.changed(STREAM_HEARTBEAT_S)
                    if board.stopping.is_set():
                        break
                    await asyncio.sleep(STREAM_MIN_INTERVAL_S)  # a burst of changes: one event
                sent = board.fleet.version
                now = now_ms()
                data = board.fleet.snapshot(now, state=state, agent=agent)
                if run_id is not None:
                    data["run"] = board.fleet.run_document(run_id, now)
                await response.write(b"event: snapshot\ndata: " + msgspec.json.encode(data) + b"\n\n")
        except (ConnectionResetError, asyncio.CancelledError):
            pass
        return response

    async def states_doc(request: web.Request) -> web.Response:
        # From a source checkout the default link (docs/states.md) resolves here; elsewhere set
        # states_doc_url to where the docs are published.
        path = Path(__file__).resolve().parents[2] / "docs" / "states.md"
        if not path.is_file():
            raise web.HTTPNotFound(text="docs/states.md is not installed here: set LOOPWARDEN_STATES_DOC_URL "
                                        "to where your docs are published")
        return web.Response(text=path.read_text(), content_type="text/plain", charset="utf-8")

    async def meta(request: web.Request) -> web.Response:
        return _json({"states": list(STATES), "attention": list(ATTENTION), "actions": ACTIONS,
                      "states_doc_url": config.states_doc_url})

    app = web.Application(middlewares=[auth])
    app.router.add_get("/", index)
    app.router.add_get("/static/{name}", asset)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/docs/states.md", states_doc)
    app.router.add_get("/api/meta", meta)
    app.router.add_get("/api/snapshot", snapshot)
    app.router.add_get("/api/runs/{run_id}", run)
    app.router.add_get("/api/stream", stream)
    return app


async def serve(board: Board) -> GuardedSite:
    c = board.config
    return await serve_guarded(make_app(board), c.web_host, c.board_port, c)


def run_board(config: Config) -> int:
    """Run the board until SIGTERM/SIGINT."""
    import signal

    # logging: loopwarden.cli.set_up_process

    async def main() -> None:
        board = Board(config)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, board.stopping.set)
        site = await serve(board)
        log.info("runs board on http://%s:%d/ (agent.health: %s)", config.web_host, site.port, config.health_topic)
        consumer = asyncio.create_task(board.consume())
        stop = asyncio.create_task(board.stopping.wait())
        try:
            done, _ = await asyncio.wait({consumer, stop}, return_when=asyncio.FIRST_COMPLETED)
            if consumer in done:
                consumer.result()  # its error, if it failed
        finally:
            board.stopping.set()
            board.notify()
            consumer.cancel()
            await asyncio.gather(consumer, return_exceptions=True)
            await site.cleanup()

    asyncio.run(main())
    return 0
