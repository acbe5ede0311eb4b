"""HTTP routes of a worker (aiohttp): /healthz, /readyz, /metrics, /runs/{run_id}, /runs (paged).

The routes read a small :class:`ReadModel` (the worker implements it), never the
loop's internals, so this module imports nothing of the loop. Bound to localhost
unless configured otherwise. With a token configured, every route but /healthz needs
``Authorization: Bearer <token>`` (401 otherwise). ``GET /runs/{id}`` for a run of a
partition another worker owns is forwarded to that worker, signed
(:mod:`loopwarden.api.peers`). ``GET /runs`` pages through an ordered index
(:mod:`loopwarden.api.readmodel`), never a scan of the store. Responses carry only
content-free evidence; every time is given in epoch ms (``*_ts``) and ISO-8601 beside it.
The server enforces header time, header size and connection limits
(:mod:`loopwarden.api.httplimits`).
"""

from __future__ import annotations

import base64
import hmac
import time
from collections.abc import Awaitable, Callable
from typing import Protocol

import msgspec
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from loopwarden.codecs import STATES
from loopwarden.rules import RunState
from loopwarden.rules.machine import evidence_of
from loopwarden.config import Config
from loopwarden.api.httplimits import GuardedSite, serve_guarded
from loopwarden.engine.metrics import EngineMetrics
from loopwarden.api.peers import ANSWER_SIGNATURE, FORWARDED, forward, peer_key, sign_answer, signed_by_peer
from loopwarden.api.readmodel import ORDERS, iso

__all__ = ["FORWARDED", "ReadModel", "make_app", "run_document", "serve"]


class ReadModel(Protocol):
    config: Config
    metrics: EngineMetrics
    stalled: set[int]
    blocked: str | None  # why the topic layout stops processing (None: it does not)

    def is_ready(self) -> bool: ...
    def owned(self) -> list[int]: ...
    def partition_of(self, run_id: str) -> int: ...
    def owner_url(self, partition: int) -> str | None: ...
    def run_state(self, run_id: str) -> RunState | None: ...
    def runs_page(self, *, state: str | None, agent: str | None, order: str, cursor: tuple | None,
                  limit: int, now_ms: int) -> tuple[list[dict], tuple | None]: ...


RUNS_PAGE_DEFAULT = 1000
RUNS_PAGE_MAX = 10_000


def encode_cursor(cursor: tuple) -> str:
    """An opaque page cursor: ``(partition, last run id)`` or ``("age", since_ts, last run id)``, base64url JSON."""
    return base64.urlsafe_b64encode(msgspec.json.encode(list(cursor))).decode().rstrip("=")


def _whole(n) -> bool:
    return isinstance(n, int) and not isinstance(n, bool) and n >= 0


def decode_cursor(text: str, order: str = "id") -> tuple | None:
    """The cursor ``text`` stands for, if this API gave it for ``order``; else None."""
    try:
        value = msgspec.json.decode(base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)))
    except (ValueError, TypeError, msgspec.DecodeError):
        return None
    if not isinstance(value, list):
        return None
    if order == "id" and len(value) == 2 and _whole(value[0]) and isinstance(value[1], str):
        return value[0], value[1]
    if order == "age" and len(value) == 3 and value[0] == "age" and isinstance(value[1], int) \
            and not isinstance(value[1], bool) and isinstance(value[2], str):
        return "age", value[1], value[2]
    return None


def _json(data, status: int = 200) -> web.Response:
    return web.Response(body=msgspec.json.encode(data), status=status, content_type="application/json")


def run_document(state: RunState, now_ms: int | None = None) -> dict:
    """A run for ``GET /runs/{id}``: its state since when and why, its evidence and its transitions."""
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    evidence = msgspec.to_builtins(evidence_of(state))
    if evidence.get("approval") and evidence["approval"].get("deadline_ts") is not None:
        evidence["approval"]["deadline"] = iso(evidence["approval"]["deadline_ts"])
    transitions, before = [], None
    for i, (seq, ts, to, reason) in enumerate(state.history):
        # from_state: the state before; unknown (absent) for the oldest kept when older ones were cut
        known = i > 0 or seq == 1
        transitions.append({"seq": seq, "ts": ts, "ts_iso": iso(ts),
                            **({"from_state": before} if known else {}), "to_state": to, "reason": reason})
        before = to
    last = state.history[-1] if state.history else None
    return {
        "run_id": state.run_id,
        "state": state.health,
        "seq": state.seq,
        "agent": state.agent,
        "policy_version": state.policy.version if state.policy else None,
        "since_ts": last[1] if last else None,
        "since": iso(last[1]) if last else None,
        "in_state_s": max(0, now_ms - last[1]) // 1000 if last else None,
        "reason": last[3] if last else None,
        "last_seen_ts": state.last_seen_ts,
        "last_seen": iso(state.last_seen_ts),
        "evidence": evidence,
        "transitions": transitions,
    }


def metrics_handler(metrics: EngineMetrics) -> Callable[[web.Request], Awaitable[web.Response]]:
    """``GET /metrics``: the Prometheus text of ``metrics.registry`` (the worker's and the bridge's route)."""
    async def handler(request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(metrics.registry), content_type=CONTENT_TYPE_LATEST.split(";")[0],
                            charset="utf-8")
    return handler


def bearer_ok(request: web.Request, expected: bytes) -> bool:
    """Whether the request carries ``Authorization: <expected>`` (compared in constant time)."""
    return hmac.compare_digest(request.headers.get("Authorization", "").encode(), expected)


def make_app(model: ReadModel) -> web.Application:
    token = model.config.token
    expected = f"Bearer {token}".encode() if token else None
    key = peer_key(token) if token else None

    def state_doc(state: str | None) -> str | None:
        """Where the state's meaning and what to do about it are: docs/states.md#<state>."""
        return f"{model.config.states_doc_url}#{state.lower()}" if state else None

    def board_page(path: str) -> bool:
        """The board's page and files (no data; its /board/api/ routes check the token themselves)."""
        return model.config.board_in_worker and (
            path in ("/board/", "/board/healthz", "/board/docs/states.md") or path.startswith("/board/static/"))

    @web.middleware
    async def auth(request: web.Request, handler):
        # Only /healthz (liveness probes) answers without the token; every other path, "/" and
        # unknown ones included, answers 401 first, so nothing about the worker shows unauthenticated.
        if expected is not None and request.path != "/healthz" and not board_page(request.path):
            if not bearer_ok(request, expected):
                nonce = signed_by_peer(request, key)
                if nonce is None:
                    return _json({"error": "unauthorized: send Authorization: Bearer <token>"}, status=401)
                response = await handler(request)
                response.headers[ANSWER_SIGNATURE] = sign_answer(key, nonce, response.status, response.body)
                return response
        return await handler(request)

    async def healthz(request: web.Request) -> web.Response:
        return _json({"status": "ok"})

    async def readyz(request: web.Request) -> web.Response:
        if not model.is_ready():
            return _json({"status": "not ready", "partitions": model.owned(),
                          "stalled": sorted(model.stalled), "layout": model.blocked}, status=503)
        return _json({"status": "ready", "partitions": model.owned()})

    async def run(request: web.Request) -> web.Response:
        run_id = request.match_info["run_id"]
        partition = model.partition_of(run_id)
        if partition not in model.owned() and FORWARDED not in request.headers:
            owner = model.owner_url(partition)
            if owner and owner.rstrip("/") != model.config.advertised_url.rstrip("/"):
                return await forward(request, owner, key)
        state = model.run_state(run_id)
        if state is None:
            return _json({"error": f"run {run_id!r} not found"}, status=404)
        return _json({**run_document(state), "state_doc": state_doc(state.health)})

    async def runs(request: web.Request) -> web.Response:
        q = request.query
        wanted = q.get("state")
        if wanted is not None and wanted not in STATES:
            return _json({"error": f"state={wanted!r}: give one of {', '.join(STATES)} (or none: every state)"},
                         status=400)
        agent = q.get("agent")
        if agent is not None and not 1 <= len(agent) <= 200:
            return _json({"error": f"agent={agent[:100]!r}: give an agent name of 1 to 200 characters"}, status=400)
        order = q.get("order", "id")
        if order not in ORDERS:
            return _json({"error": f"order={order[:100]!r}: give id (run id order, the default) or age "
                                   "(longest in its state first)"}, status=400)
        raw_limit = q.get("limit", str(RUNS_PAGE_DEFAULT))
        try:
            limit = int(raw_limit)
        except ValueError:
            limit = 0
        if not 1 <= limit <= RUNS_PAGE_MAX:
            return _json({"error": f"limit={raw_limit!r}: give a whole number from 1 to {RUNS_PAGE_MAX}"}, status=400)
        cursor = None
        if "cursor" in q:
            cursor = decode_cursor(q["cursor"], order)
            if cursor is None:
                return _json({"error": f"cursor={q['cursor'][:100]!r}: not a cursor this API gave (next_cursor) "
                                       f"for order={order}"}, status=400)
        now_ms = int(time.time() * 1000)
        found, after = model.runs_page(state=wanted, agent=agent, order=order, cursor=cursor, limit=limit,
                                       now_ms=now_ms)
        for r in found:
            r["state_doc"] = state_doc(r["state"])
        return _json({"state": wanted, "agent": agent, "order": order, "partitions": model.owned(),
                      "now_ts": now_ms, "now": iso(now_ms), "runs": found,
                      "next_cursor": encode_cursor(after) if after is not None else None})

    app = web.Application(middlewares=[auth])
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics_handler(model.metrics))
    app.router.add_get("/runs/{run_id}", run)
    app.router.add_get("/runs", runs)
    return app


async def serve(model: ReadModel) -> GuardedSite:
    """Start the HTTP server on the configured host and port, with the ``http_*`` limits (and, with
    ``board_in_worker``, the runs board at /board/); ``await site.cleanup()`` stops it."""
    config = model.config
    app = make_app(model)
    board = None
    if config.board_in_worker:
        from loopwarden.api.board.reader import Board
        from loopwarden.api.board.server import make_app as board_app

        board = Board(config)
        app.add_subapp("/board/", board_app(board, prefix="/board"))
    site = await serve_guarded(app, config.web_host, config.web_port, config)
    if board is not None:
        site.also_run(board.consume(), board.stop)
    return site
