"""``loopwarden bridge``: the OpenTelemetry bridge alone, for operators who scale it apart from the workers.

It serves ``/healthz``, ``/readyz`` (its partitions recovered, none stalled) and ``/metrics``
on the configured web host and port, with the same HTTP limits and token as the worker.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from aiohttp import web

from loopwarden.stages.otel.stage import BridgeStage, bridge_config
from loopwarden.config import Config
from loopwarden.engine.loop import Engine
from loopwarden.api.http import bearer_ok, metrics_handler
from loopwarden.api.httplimits import serve_guarded
from loopwarden.engine.metrics import EngineMetrics
from loopwarden.stages.otel.metrics import OtelMetrics
from loopwarden.engine.runner import run_engines, run_process

log = logging.getLogger("loopwarden.bridge")


def make_app(engine: Engine, metrics: EngineMetrics, token: str | None) -> web.Application:
    expected = f"Bearer {token}".encode() if token else None

    @web.middleware
    async def auth(request: web.Request, handler):  # the worker's check, without its peers' signed reads
        if expected and request.path != "/healthz" and not bearer_ok(request, expected):
            return web.json_response({"error": "unauthorized"}, status=401)
        return await handler(request)

    async def healthz(request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def readyz(request: web.Request) -> web.Response:
        stalled = sorted(p for p, a in engine.assigned.items() if a.stalled)
        if not engine.ready or stalled:
            return web.json_response({"status": "not ready", "stalled": stalled}, status=503)
        return web.json_response({"status": "ready", "partitions": sorted(engine.owned_partitions())})

    app = web.Application(middlewares=[auth])
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics_handler(metrics))  # the worker's route
    return app


def run_bridge(config: Config, on_recovered: Callable[[], None] | None = None) -> int:
    """Run the bridge until SIGTERM/SIGINT; exit by ``shutdown_timeout_s`` after the signal whatever happens."""

    async def main() -> None:
        metrics = EngineMetrics()
        bridge = bridge_config(config)
        engine = Engine(bridge, BridgeStage(bridge, OtelMetrics(metrics), config), metrics, on_recovered)
        app = make_app(engine, metrics, config.token)
        await run_engines([engine], config.shutdown_timeout_s,
                          lambda: serve_guarded(app, config.web_host, config.web_port, config), logger=log)

    run_process(main)
    return 0
