"""HTTP routes of a worker (aiohttp): /healthz, /readyz, /metrics, /runs/{run_id}, /runs (paged, ?state=).

The routes read a small :class:`ReadModel` (the worker implements it), never the
loop's internals, so this module imports nothing of the loop. Bound to localhost
unless configured otherwise. With a token configured, every route but /healthz needs
``Authorization: Bearer <token>`` (401 otherwise). ``GET /runs/{id}`` for a run of a
partition another worker owns is forwarded to that worker (the owner map comes with
the group's assignment). Responses carry only content-free evidence.

Forwarding never hands the caller's token to a peer: anyone who can join the consumer
group can advertise a URL. With a token, the forwarded request is signed with a key
derived from it (HMAC-SHA256 over method, path, time and a nonce) and the owner signs
its answer (over the nonce, status and body); an answer without a valid signature is
refused (502), so a member that does not know the token can neither read the token
nor forge a run. Without a token the API is open and peers are trusted.
"""

from __future__ import annotations

import base64

import hashlib
import hmac
import logging
import secrets
import time
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
PEER_TS = "X-Loopwarden-Peer-Ts"
PEER_NONCE = "X-Loopwarden-Peer-Nonce"
PEER_SIGNATURE = "X-Loopwarden-Peer-Signature"
ANSWER_SIGNATURE = "X-Loopwarden-Answer-Signature"
PEER_WINDOW_MS = 30_000  # a signed request older (or newer) than this is refused


def peer_key(token: str) -> bytes:
    """The key peers sign forwarded reads with: derived from the token, never the token itself."""
    return hmac.new(token.encode(), b"loopwarden/peer-signing/v1", hashlib.sha256).digest()


def _sign(key: bytes, *parts: bytes) -> str:
    return hmac.new(key, b"\n".join(parts), hashlib.sha256).hexdigest()


def sign_request(key: bytes, method: str, path_qs: str, ts_ms: int, nonce: str) -> str:
    return _sign(key, method.encode(), path_qs.encode(), str(ts_ms).encode(), nonce.encode())


def sign_answer(key: bytes, nonce: str, status: int, body: bytes) -> str:
    return _sign(key, nonce.encode(), str(status).encode(), body)


class ReadModel(Protocol):
    config: Config
    metrics: Metrics
    stalled: set[int]

    def is_ready(self) -> bool: ...
    def owned(self) -> list[int]: ...
    def partition_of(self, run_id: str) -> int: ...
    def owner_url(self, partition: int) -> str | None: ...
    def run_state(self, run_id: str) -> RunState | None: ...
    def runs_page(self, state: str | None, cursor: tuple[int, str] | None, limit: int) -> tuple[list[dict], tuple | None]: ...


RUNS_PAGE_DEFAULT = 1000
RUNS_PAGE_MAX = 10_000


def encode_cursor(cursor: tuple[int, str]) -> str:
    """An opaque page cursor: (partition, last run id) as base64url JSON."""
    return base64.urlsafe_b64encode(msgspec.json.encode(list(cursor))).decode().rstrip("=")


def decode_cursor(text: str) -> tuple[int, str] | None:
    try:
        p, run_id = msgspec.json.decode(base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)))
    except (ValueError, TypeError, msgspec.DecodeError):
        return None
    if not isinstance(p, int) or isinstance(p, bool) or p < 0 or not isinstance(run_id, str):
        return None
    return p, run_id


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
    key = peer_key(token) if token else None

    def signed_by_peer(request: web.Request) -> str | None:
        """The nonce of a validly signed forwarded read, else None."""
        if key is None or not request.path.startswith("/runs/") or FORWARDED not in request.headers:
            return None
        ts, nonce, signature = (request.headers.get(h, "") for h in (PEER_TS, PEER_NONCE, PEER_SIGNATURE))
        if not ts.isdigit() or not 16 <= len(nonce) <= 64 or abs(time.time() * 1000 - int(ts)) > PEER_WINDOW_MS:
            return None
        good = sign_request(key, request.method, request.rel_url.path_qs, int(ts), nonce)
        return nonce if hmac.compare_digest(signature.encode(), good.encode()) else None

    @web.middleware
    async def auth(request: web.Request, handler):
        # Only /healthz (liveness probes) answers without the token; every other path, "/" and
        # unknown ones included, answers 401 first, so nothing about the worker shows unauthenticated.
        if expected is not None and request.path != "/healthz":
            given = request.headers.get("Authorization", "").encode()
            if not hmac.compare_digest(given, expected):
                nonce = signed_by_peer(request)
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
                return await _forward(request, owner, key)
        state = model.run_state(run_id)
        if state is None:
            return _json({"error": f"run {run_id!r} not found"}, status=404)
        return _json(run_document(state))

    async def runs(request: web.Request) -> web.Response:
        q = request.query
        wanted = q.get("state")
        if wanted is not None and wanted not in STATES:
            return _json({"error": f"state={wanted!r}: give one of {', '.join(STATES)} (or none: every state)"},
                         status=400)
        raw_limit = q.get("limit", str(RUNS_PAGE_DEFAULT))
        try:
            limit = int(raw_limit)
        except ValueError:
            limit = 0
        if not 1 <= limit <= RUNS_PAGE_MAX:
            return _json({"error": f"limit={raw_limit!r}: give a whole number from 1 to {RUNS_PAGE_MAX}"}, status=400)
        cursor = None
        if "cursor" in q:
            cursor = decode_cursor(q["cursor"])
            if cursor is None:
                return _json({"error": f"cursor={q['cursor'][:100]!r}: not a cursor this API gave (next_cursor)"},
                             status=400)
        found, after = model.runs_page(wanted, cursor, limit)
        return _json({"state": wanted, "partitions": model.owned(), "runs": found,
                      "next_cursor": encode_cursor(after) if after is not None else None})

    app = web.Application(middlewares=[auth])
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/runs/{run_id}", run)
    app.router.add_get("/runs", runs)
    return app


async def _forward(request: web.Request, owner: str, key: bytes | None) -> web.Response:
    """Ask the owner; its answer is passed on (status and JSON body) once its signature checks out.

    The caller's Authorization header is never sent: with a token the request is signed
    with the key derived from it (see :func:`peer_key`)."""
    path_qs = request.rel_url.path_qs
    headers = {FORWARDED: "1"}
    nonce = ""
    if key is not None:
        ts, nonce = int(time.time() * 1000), secrets.token_hex(16)
        headers.update({PEER_TS: str(ts), PEER_NONCE: nonce,
                        PEER_SIGNATURE: sign_request(key, "GET", path_qs, ts, nonce)})
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session:
            async with session.get(owner.rstrip("/") + path_qs, headers=headers, allow_redirects=False) as resp:
                body = await resp.read()
                signature = resp.headers.get(ANSWER_SIGNATURE, "")
                status = resp.status
    except (aiohttp.ClientError, TimeoutError) as exc:
        log.warning("forwarding %s to %s failed: %s", request.rel_url, owner, exc)
        return _json({"error": f"owner {owner} of this run did not answer"}, status=502)
    if key is not None and not hmac.compare_digest(signature.encode(), sign_answer(key, nonce, status, body).encode()):
        log.warning("the answer of %s for %s is not signed with this deployment's token: refused "
                    "(a group member that does not know the token?)", owner, path_qs)
        return _json({"error": f"the answer of owner {owner} for this run could not be verified"}, status=502)
    return web.Response(status=status, body=body, content_type="application/json")


async def serve(model: ReadModel) -> web.AppRunner:
    """Start the HTTP server on the configured host and port; ``await runner.cleanup()`` stops it."""
    runner = web.AppRunner(make_app(model), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, model.config.web_host, model.config.web_port)
    await site.start()
    return runner
