"""HTTP routes of a worker: /healthz, /readyz, /metrics, /runs/{run_id}, /runs?state=.

Bound to localhost unless configured otherwise. With a token configured, every
route but /healthz needs ``Authorization: Bearer <token>`` (401 otherwise).
Responses carry only content-free evidence.
"""

from __future__ import annotations

import hmac
from typing import TYPE_CHECKING

import faust
import msgspec
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from loopwarden.codecs import STATES
from loopwarden.rules.machine import evidence_of

if TYPE_CHECKING:
    from loopwarden.streams.app import Loopwarden


def add_routes(lw: "Loopwarden") -> None:
    app, token = lw.app, lw.config.token

    def denied(view: faust.web.View, request) -> object | None:
        if token is None:
            return None
        given = request.headers.get("Authorization", "")
        if hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
            return None
        return view.json({"error": "unauthorized: send Authorization: Bearer <token>"}, status=401)

    @app.page("/healthz")
    class Healthz(faust.web.View):
        async def get(self, request):
            return self.json({"status": "ok"})

    @app.page("/readyz")
    class Readyz(faust.web.View):
        async def get(self, request):
            if (resp := denied(self, request)) is not None:
                return resp
            if not lw.ready:
                return self.json({"status": "recovering"}, status=503)
            return self.json({"status": "ready", "partitions": sorted(lw.active_partitions())})

    @app.page("/metrics")
    class Metrics(faust.web.View):
        async def get(self, request):
            if (resp := denied(self, request)) is not None:
                return resp
            return self.bytes(generate_latest(lw.metrics.registry), content_type=CONTENT_TYPE_LATEST.split(";")[0])

    @app.page("/runs/{run_id}")
    class Run(faust.web.View):
        async def get(self, request, run_id: str):
            if (resp := denied(self, request)) is not None:
                return resp
            return await self._owned(request, run_id=run_id)

        @app.table_route(table=lw.table, match_info="run_id")
        async def _owned(self, request, run_id: str):
            state = lw.processor.load(run_id)
            if state is None:
                return self.json({"error": f"run {run_id!r} not found"}, status=404)
            return self.json({
                "run_id": run_id,
                "state": state.health,
                "seq": state.seq,
                "agent": state.agent,
                "policy_version": state.policy.version if state.policy else None,
                "evidence": msgspec.to_builtins(evidence_of(state)),
                "transitions": [
                    {"seq": seq, "ts": ts, "to_state": to, "reason": reason}
                    for seq, ts, to, reason in state.history
                ],
            })

    @app.page("/runs")
    class Runs(faust.web.View):
        async def get(self, request):
            if (resp := denied(self, request)) is not None:
                return resp
            wanted = request.query.get("state")
            if wanted not in STATES:
                return self.json({"error": f"state={wanted!r}: give one of {', '.join(STATES)}"}, status=400)
            runs = lw.processor.runs_in_state(wanted, lw.active_partitions())
            return self.json({"state": wanted, "partitions": sorted(lw.active_partitions()), "runs": runs})
