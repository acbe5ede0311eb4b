"""``file``: a local or mounted path — exists, size floor, sha256, content type by sniffing.

Target ``file:///abs/path``; the path with symlinks resolved must lie under a configured
``file.prefixes`` entry (a link pointing outside is refused like any other path outside).
Checks: ``min_size`` (int), ``sha256`` (hex), ``content_type`` (sniffed, never from the name).
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import stat
import time
from urllib.parse import unquote, urlsplit

from loopwarden.codecs import OutcomeExpected
from loopwarden.verify.checkers.base import (
    BadExpectation, CannotAsk, Context, Measured, NotAllowed, known_checks, scalar,
)
from loopwarden.verify.checkers.sniff import SNIFF_BYTES, sniff

CHUNK = 1024 * 1024
SMALL = 1024 * 1024  # a document this small is parsed whole to tell JSON from text


def local_path(target: str, ctx: Context) -> str:
    """The real path a ``file://`` target names, if inside the allow-list (NotAllowed otherwise)."""
    parts = urlsplit(target)
    if parts.scheme != "file" or parts.netloc not in ("", "localhost") or parts.query or parts.fragment:
        raise BadExpectation("bad_target", f"target {target[:200]!r} is not file:///absolute/path")
    path = unquote(parts.path)
    if "\x00" in path or not os.path.isabs(path):
        raise BadExpectation("bad_target", f"target {target[:200]!r} is not file:///absolute/path")
    real = os.path.realpath(path)
    if not any(os.path.join(real, "").startswith(p) or real + os.sep == p for p in ctx.config.real_prefixes):
        raise NotAllowed("outside_allow_list", f"path {path[:200]!r} is outside file.prefixes")
    return real


def read_measure(path: str, want_hash: bool, deadline: float, max_bytes: int | None = None) -> dict:
    """Size, sha256 and head of a regular file, reading at most until ``deadline`` (monotonic)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        return {"exists": False}
    except OSError as exc:
        raise CannotAsk("unreadable", f"cannot open {path!r}: {exc.strerror}") from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            return {"exists": True, "regular": False}
        head = f.read(SNIFF_BYTES)
        whole = head + f.read(SMALL - len(head)) if st.st_size <= SMALL else None
        digest = hashlib.sha256(whole if whole is not None else head) if want_hash else None
        read = len(whole) if whole is not None else len(head)
        if want_hash and whole is None:
            while chunk := f.read(CHUNK):
                digest.update(chunk)  # type: ignore[union-attr]
                read += len(chunk)
                if time.monotonic() > deadline:
                    raise CannotAsk("timeout", f"hashing {path!r} took longer than the check timeout")
                if max_bytes is not None and read > max_bytes:
                    raise CannotAsk("too_large", f"{path!r} is larger than max_body_bytes={max_bytes}")
        return {"exists": True, "regular": True, "size": st.st_size, "head": head, "whole": whole,
                "sha256": digest.hexdigest() if digest is not None else None}


class FileChecker:
    name = "file"
    CHECKS = ("min_size", "sha256", "content_type")

    def accepts(self, expectation: OutcomeExpected) -> bool:
        return expectation.target.startswith("file:") and "json_schema" not in expectation.checks

    async def check(self, expectation: OutcomeExpected, ctx: Context) -> Measured:
        checks = expectation.checks
        known_checks(checks, self.CHECKS, self.name)
        min_size = scalar(checks, "min_size", int)
        want_sha = scalar(checks, "sha256", str)
        want_type = scalar(checks, "content_type", str)
        path = local_path(expectation.target, ctx)
        deadline = time.monotonic() + ctx.timeout_s
        m = await asyncio.to_thread(read_measure, path, True, deadline)
        if not m["exists"]:
            return Measured(False, {}, "missing")
        if not m["regular"]:
            return Measured(False, {}, "not_a_file")
        media = sniff(m["head"], m["whole"])
        evidence = {"size": m["size"], "sha256": m["sha256"], "content_type": media}
        if min_size is not None and m["size"] < min_size:
            return Measured(False, evidence, "size_below_floor")
        if want_sha is not None and m["sha256"] != want_sha.lower():
            return Measured(False, evidence, "sha256_mismatch")
        if want_type is not None and media != want_type.split(";")[0].strip().lower():
            return Measured(False, evidence, "content_type_mismatch")
        return Measured(True, evidence)
