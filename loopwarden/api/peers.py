"""How workers read runs from each other: ``GET /runs/{id}`` forwarded to the run's owner, signed both ways.

Forwarding never hands the caller's token to a peer: anyone who can join the consumer
group can advertise a URL. With a token, the forwarded request is signed with a key
derived from it (HMAC-SHA256 over method, path, time and a nonce) and the owner signs
its answer (over the nonce, status and body); an answer without a valid signature is
refused (502), so a member that does not know the token can neither read the token
nor forge a run. Without a token the API is open and peers are trusted.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
import time

import aiohttp
from aiohttp import web

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


def signed_by_peer(request: web.Request, key: bytes | None) -> str | None:
    """The nonce of a validly signed forwarded read (``GET /runs/{id}`` from a peer), else None."""
    if key is None or not request.path.startswith("/runs/") or FORWARDED not in request.headers:
        return None
    ts, nonce, signature = (request.headers.get(h, "") for h in (PEER_TS, PEER_NONCE, PEER_SIGNATURE))
    if not ts.isdigit() or not 16 <= len(nonce) <= 64 or abs(time.time() * 1000 - int(ts)) > PEER_WINDOW_MS:
        return None
    good = sign_request(key, request.method, request.rel_url.path_qs, int(ts), nonce)
    return nonce if hmac.compare_digest(signature.encode(), good.encode()) else None


def _error(text: str, status: int) -> web.Response:
    return web.json_response({"error": text}, status=status)


async def forward(request: web.Request, owner: str, key: bytes | None) -> web.Response:
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
        return _error(f"owner {owner} of this run did not answer", 502)
    if key is not None and not hmac.compare_digest(signature.encode(), sign_answer(key, nonce, status, body).encode()):
        log.warning("the answer of %s for %s is not signed with this deployment's token: refused "
                    "(a group member that does not know the token?)", owner, path_qs)
        return _error(f"the answer of owner {owner} for this run could not be verified", 502)
    return web.Response(status=status, body=body, content_type="application/json")
