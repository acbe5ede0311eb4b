"""``http``: an ``https://`` URL (a deployment, a public or presigned object URL).

The URL's host (and port, 443 by default) must be in ``http.hosts``; TLS is always verified
(``http.cafile`` or the system's CAs); redirects are not followed (a redirect could leave the
allow-list: its status is what was measured). The body is read up to ``max_body_bytes``.
Checks: ``status`` (int, default 200), ``header`` ({name: value}), ``json`` ({JSON pointer: value},
e.g. ``{"/version": "1.4.2"}``), ``min_size``, ``sha256``, ``content_type`` (the header's media type).
Evidence: status, size, sha256, and for each header / pointer whether it matched — never a value nor a
digest of one (a digest of a version string or a status is the value to anyone who tries the candidates).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import ssl
from urllib.parse import urlsplit

import aiohttp

from loopwarden.codecs import OutcomeExpected
from loopwarden.verify.checkers.base import (
    BadExpectation, CannotAsk, Context, Measured, NotAllowed, known_checks, mapping, scalar,
)

CHUNK = 64 * 1024


def allowed_url(target: str, ctx: Context) -> str:
    """The URL if it is https:// to an allowed host[:port] (NotAllowed / BadExpectation otherwise)."""
    try:
        parts = urlsplit(target)
        port = parts.port or 443
    except ValueError:
        raise BadExpectation("bad_target", f"target {target[:200]!r} is not a URL") from None
    if parts.scheme != "https":
        raise NotAllowed("not_https", f"target {target[:200]!r}: only https:// URLs are checked")
    if parts.username or parts.password:
        raise NotAllowed("credentials_in_url", "target carries credentials: they come from the verifier's config only")
    host = (parts.hostname or "").lower()
    allowed = {h.lower() if ":" in h else f"{h.lower()}:443" for h in ctx.config.http_hosts}
    if f"{host}:{port}" not in allowed:
        raise NotAllowed("outside_allow_list", f"host {host}:{port} is not in http.hosts")
    return f"{host}:{port}"


def ssl_context(cafile: str | None) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=cafile)  # verifies certificates and host names


async def fetch(target: str, ctx: Context, max_bytes: int) -> tuple[int, dict, int, str, bytes | None, bool]:
    """GET ``target`` (already allowed): status, headers, size, sha256, body (when within the small
    limit for JSON), and whether it was cut at ``max_bytes``."""
    hostport = allowed_url(target, ctx)
    configured = ctx.config.http_headers.get(hostport) or ctx.config.http_headers.get(hostport.removesuffix(":443"), {})
    headers = {name: os.environ.get(env, "") for name, env in configured.items()}  # credentials: config only
    session = ctx.http_session
    try:
        async with session.get(target, headers=headers, allow_redirects=False,
                               timeout=aiohttp.ClientTimeout(total=ctx.timeout_s)) as resp:
            digest, size, body, cut = hashlib.sha256(), 0, bytearray(), False
            async for chunk in resp.content.iter_chunked(CHUNK):
                size += len(chunk)
                if size > max_bytes:
                    cut = True
                    break
                digest.update(chunk)
                if len(body) < 4 * 1024 * 1024:
                    body += chunk
            return resp.status, dict(resp.headers), size, digest.hexdigest(), bytes(body), cut
    except asyncio.TimeoutError:
        raise CannotAsk("timeout", f"{hostport}: no complete answer within {ctx.timeout_s} s") from None
    except aiohttp.ClientConnectorCertificateError as exc:
        raise CannotAsk("tls", f"{hostport}: TLS verification failed: {exc}") from None
    except aiohttp.ClientSSLError as exc:
        raise CannotAsk("tls", f"{hostport}: TLS failed: {exc}") from None
    except aiohttp.ClientError as exc:
        raise CannotAsk("unreachable", f"{hostport}: {type(exc).__name__}: {exc}") from None


def json_pointer(doc, pointer: str):
    """RFC 6901; raises KeyError when the pointer names nothing."""
    if pointer == "":
        return doc
    if not pointer.startswith("/"):
        raise BadExpectation("bad_check", f"json pointer {pointer!r} must start with '/'")
    node = doc
    for token in pointer[1:].split("/"):
        token = token.replace("~1", "/").replace("~0", "~")
        if isinstance(node, list):
            if not token.isdigit():
                raise KeyError(pointer)
            node = node[int(token)]
        elif isinstance(node, dict):
            node = node[token]
        else:
            raise KeyError(pointer)
    return node


class HttpChecker:
    name = "http"
    CHECKS = ("status", "header", "json", "min_size", "sha256", "content_type")

    def accepts(self, expectation: OutcomeExpected) -> bool:
        return expectation.target.startswith(("https:", "http:")) and "json_schema" not in expectation.checks

    async def check(self, expectation: OutcomeExpected, ctx: Context) -> Measured:
        checks = expectation.checks
        known_checks(checks, self.CHECKS, self.name)
        want_status = scalar(checks, "status", int) or 200
        headers_want, json_want = mapping(checks, "header"), mapping(checks, "json")
        min_size, want_sha = scalar(checks, "min_size", int), scalar(checks, "sha256", str)
        want_type = scalar(checks, "content_type", str)
        status, headers, size, sha, body, cut = await fetch(expectation.target, ctx, ctx.max_body_bytes)
        if cut:
            return Measured(False, {"status": status, "size_over": ctx.max_body_bytes}, "body_too_large")
        evidence: dict = {"status": status, "size": size, "sha256": sha}
        if status != want_status:
            return Measured(False, evidence, "status_mismatch")
        lower = {k.lower(): v for k, v in headers.items()}
        for name, want in headers_want.items():
            got = lower.get(name.lower())
            evidence[f"header:{name.lower()[:60]}"] = got == str(want)
            if got != str(want):
                return Measured(False, evidence, "header_mismatch")
        if want_type is not None:
            media = lower.get("content-type", "").split(";")[0].strip().lower()
            evidence["content_type"] = media[:100]
            if media != want_type.lower():
                return Measured(False, evidence, "content_type_mismatch")
        if json_want:
            try:
                doc = json.loads(body or b"")
            except ValueError:
                return Measured(False, evidence, "body_not_json")
            for pointer, want in json_want.items():
                try:
                    got = json_pointer(doc, pointer)
                except (KeyError, IndexError):
                    evidence[f"json:{pointer[:60]}"] = False
                    return Measured(False, evidence, "json_pointer_missing")
                ok = got == want and type(got) is type(want) or (not isinstance(got, (dict, list)) and str(got) == str(want))
                evidence[f"json:{pointer[:60]}"] = bool(ok)
                if not ok:
                    return Measured(False, evidence, "json_value_mismatch")
        if min_size is not None and size < min_size:
            return Measured(False, evidence, "size_below_floor")
        if want_sha is not None and sha != want_sha.lower():
            return Measured(False, evidence, "sha256_mismatch")
        return Measured(True, evidence)
