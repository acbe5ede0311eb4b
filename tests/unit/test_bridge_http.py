"""`loopwarden bridge`'s HTTP routes over a real socket: /metrics is the worker's route, the token the worker's check."""

from __future__ import annotations

import asyncio
import urllib.error
import urllib.request

from aiohttp import web
from prometheus_client import generate_latest

from loopwarden.stages.otel.run import make_app
from loopwarden.api.http import metrics_handler
from loopwarden.engine.metrics import EngineMetrics

TOKEN = "a-token-of-sixteen-chars"


def _get(port: int, path: str, token: str | None = None) -> tuple[int, str, bytes]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}",
                                     headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.headers["Content-Type"], response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers["Content-Type"], exc.read()


def test_the_bridge_serves_the_workers_metrics_route_behind_the_workers_token_check() -> None:
    """The bridge's /metrics answers like the worker's handler (same body and Content-Type); without the token, 401."""
    metrics = EngineMetrics()
    metrics.transactions.labels("committed").inc(3)

    async def scenario():
        answers = {}
        for name, app in (("bridge", make_app(None, metrics, TOKEN)), ("worker", _worker_metrics_app(metrics))):  # type: ignore[arg-type]
            runner = web.AppRunner(app)
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            port = runner.addresses[0][1]
            token = TOKEN if name == "bridge" else None
            answers[name] = await asyncio.to_thread(_get, port, "/metrics", token)
            if name == "bridge":
                answers["no token"] = await asyncio.to_thread(_get, port, "/metrics")
                answers["healthz"] = await asyncio.to_thread(_get, port, "/healthz")
            await runner.cleanup()
        return answers

    answers = asyncio.run(scenario())
    status, content_type, body = answers["bridge"]
    assert status == 200 and content_type == answers["worker"][1] == "text/plain; charset=utf-8"
    help_lines = {line for line in generate_latest(metrics.registry).splitlines() if line.startswith(b"# HELP")}
    assert {line for line in body.splitlines() if line.startswith(b"# HELP")} == help_lines
    assert b'loopwarden_transactions_total{result="committed"} 3.0' in body
    assert answers["no token"][0] == 401 and answers["healthz"][0] == 200


def _worker_metrics_app(metrics: EngineMetrics) -> web.Application:
    app = web.Application()
    app.router.add_get("/metrics", metrics_handler(metrics))
    return app
