"""HTTP routes of a worker (aiohttp): /healthz, /readyz, /metrics, /runs/{run_id}, /runs?state=.

The routes read a small :class:`ReadModel` (the worker implements it), never the
loop's internals, so this module imports nothing of the loop. Bound to localhost
unless configured otherwise. With a token configured, every route but /healthz needs
``Authorization: Bearer <token>`` (401 otherwise). ``GET /runs/{id}`` for a run of a
partition another worker owns is forwarded to that worker (the owner map comes with
the group's assignment). Responses carry only content-free evidence.
"""

from __future__ import annotations

import hmac
import logging
from typing import Protocol

import aiohttp
import msgspec
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from loopwarden.codecs import STATES
from loopwarden.rules import RunState
from loopwarden.rules.machine import evidence_of
from loopwarden.streams.config import Config
from loopwarden.streams.metrics import Metrics

log = logging.getLogger("loopwarden.http")
FORWARDED = "X-Loopwarden-Forwarded"


class ReadModel(Protocol):
    config: Config
    metrics: Metrics
    stalled: set[int]

    def is_ready(self) -> bool: ...
    def owned(self) -> list[int]: ...
    def partition_of(self, run_id: str) -> int: ...
    def owner_url(self, partition: int) -> str | None: ...
    def run_state(self, run_id: str) -> RunState | None: ...
    def runs_in_state(self, state: str, limit: int = 1000) -> list[dict]: ...


def _json(data, status: int = 200) -> web.Response:
    return web.Response(body=msgspec.json.encode(data), status=status, content_type="application/json")


def run_document(state: RunState) -> dict:
    return {
        "run_id": state.run_id,
        "state": state.health,
        "seq": state.seq,
        "agent": state.agent,
        "policy_version": state.policy.version if state.policy else None,
        "evidence": msgspec.to_builtins(evidence_of(state)),
        "transitions": [{"seq": seq, "ts": ts, "to_state": to, "reason": reason}
                        for seq, ts, to, reason in state.history],
    }


def make_app(model: ReadModel) -> web.Application:
    token = model.config.token
    expected = f"Bearer {token}".encode() if token else None

    @web.middleware
    async def auth(request: web.Request, handler):
        if expected is not None and request.path != "/healthz":
            given = request.headers.get("Authorization", "").encode()
            if not hmac.compare_digest(given, expected):
                return _json({"error": "unauthorized: send Authorization: Bearer <token>"}, status=401)
        return await handler(request)

    async def healthz(request: web.Request) -> web.Response:
        return _json({"status": "ok"})

    async def readyz(request: web.Request) -> web.Response:
        if not model.is_ready():
            return _json({"status": "not ready", "partitions": model.owned(),
                                      "stalled": sorted(model.stalled)}, status=503)
        return _json({"status": "ready", "partitions": model.owned()})

    async def metrics(request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(model.metrics.registry),
                            content_type=CONTENT_TYPE_LATEST.split(";")[0], charset="utf-8")

    async def run(request: web.Request) -> web.Response:
        run_id = request.match_info["run_id"]
        partition = model.partition_of(run_id)
        if partition not in model.owned() and FORWARDED not in request.headers:
            owner = model.owner_url(partition)
            if owner and owner.rstrip("/") != model.config.advertised_url.rstrip("/"):
                return await _forward(request, owner)
        state = model.run_state(run_id)
        if state is None:
            return _json({"error": f"run {run_id!r} not found"}, status=404)
        return _json(run_document(state))

    async def runs(request: web.Request) -> web.Response:
        wanted = request.query.get("state")
        if wanted not in STATES:
            return _json({"error": f"state={wanted!r}: give one of {', '.join(STATES)}"}, status=400)
        return _json({"state": wanted, "partitions": model.owned(), "runs": model.runs_in_state(wanted)})

    app = web.Application(middlewares=[auth])
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/runs/{run_id}", run)
    app.router.add_get("/runs", runs)
    return app


async def _forward(request: web.Request, owner: str) -> web.Response:
    """Ask the owner; its answer is passed on (status and JSON body)."""
    headers = {FORWARDED: "1"}
    if "Authorization" in request.headers:
        headers["Authorization"] = request.headers["Authorization"]
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session:
            async with session.get(owner.rstrip("/") + request.rel_url.path_qs, headers=headers) as resp:
                body = await resp.read()
                return web.Response(status=resp.status, body=body, content_type="application/json")
    except (aiohttp.ClientError, TimeoutError) as exc:
        log.warning("forwarding %s to %s failed: %s", request.rel_url, owner, exc)
        return _json({"error": f"owner {owner} of this run did not answer"}, status=502)


async def serve(model: ReadModel) -> web.AppRunner:
    """Start the HTTP server on the configured host and port; ``await runner.cleanup()`` stops it."""
    runner = web.AppRunner(make_app(model), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, model.config.web_host, model.config.web_port)
    await site.start()
    return runner
