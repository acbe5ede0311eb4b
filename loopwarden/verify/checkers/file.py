"""``file``: a local or mounted path — exists, size floor, sha256, content type by sniffing.

Target ``file:///abs/path`` under a configured ``file.prefixes`` entry (the prefix is the
operator's: its own symlinks are resolved when the config loads). Below the prefix the path is
opened one component at a time, each relative to the directory opened before it
(``os.open(..., dir_fd=...)`` with ``O_NOFOLLOW``, ``O_DIRECTORY`` for directories), and the file
measured is the one that walk opened: no symlink and no ``..`` is ever followed, so swapping a
directory for a link while a check runs cannot make the verifier measure a file outside the
prefix (a symlink or ``..`` under the prefix is refused, ``symlink`` / ``outside_allow_list``).
Checks: ``min_size`` (int), ``sha256`` (hex), ``content_type`` (sniffed, never from the name).
"""

from __future__ import annotations

import asyncio
import errno
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
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_LEAF = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC  # NONBLOCK: a FIFO does not hang the open


class Under:
    """A path the allow-list admits: the prefix's real directory and the components below it."""

    __slots__ = ("root", "parts")

    def __init__(self, root: str, parts: tuple[str, ...]) -> None:
        self.root, self.parts = root, parts

    def __str__(self) -> str:
        return os.path.join(self.root, *self.parts)


def local_path(target: str, ctx: Context) -> Under:
    """Where a ``file://`` target lies under the allow-list (NotAllowed outside it, or with ``..``)."""
    parts = urlsplit(target)
    if parts.scheme != "file" or parts.netloc not in ("", "localhost") or parts.query or parts.fragment:
        raise BadExpectation("bad_target", f"target {target[:200]!r} is not file:///absolute/path")
    path = unquote(parts.path)
    if "\x00" in path or not os.path.isabs(path):
        raise BadExpectation("bad_target", f"target {target[:200]!r} is not file:///absolute/path")
    names = [n for n in path.split("/") if n and n != "."]
    if ".." in names:
        raise NotAllowed("outside_allow_list", f"path {path[:200]!r} holds '..' (never followed)")
    config = ctx.config
    for given, real in zip(config.file_prefixes, config.real_prefixes):
        for prefix in {real, os.path.join(os.path.normpath(given), "")}:
            root = [n for n in prefix.split("/") if n]
            if names[:len(root)] == root:
                return Under(real, tuple(names[len(root):]))
    raise NotAllowed("outside_allow_list", f"path {path[:200]!r} is outside file.prefixes")


def _open_under(where: Under) -> int | None:
    """A descriptor of the file ``where`` names, opened by the walk; None when it does not exist."""
    try:
        fd = os.open(where.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise CannotAsk("unreadable", f"cannot open the prefix {where.root!r}: {exc.strerror}") from None
    try:
        last = len(where.parts) - 1
        for i, name in enumerate(where.parts):
            try:
                nxt = os.open(name, _DIR if i < last else _LEAF, dir_fd=fd)
            except OSError as exc:
                if exc.errno == errno.ENOENT:
                    return None
                kind = _kind(name, fd)
                if kind is not None and stat.S_ISLNK(kind):
                    raise NotAllowed("symlink", f"{where}: {name!r} is a symbolic link (none is followed)") from None
                if exc.errno == errno.ENOTDIR:  # a file where the path needs a directory
                    return None
                raise CannotAsk("unreadable", f"cannot open {str(where)!r}: {exc.strerror}") from None
            os.close(fd)
            fd = nxt
        leaf_fd, fd = fd, -1
        return leaf_fd
    finally:
        if fd >= 0:
            os.close(fd)


def _kind(name: str, dir_fd: int) -> int | None:
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode
    except OSError:
        return None


def read_measure(where: Under, want_hash: bool, deadline: float, max_bytes: int | None = None) -> dict:
    """Size, sha256 and head of a regular file, reading at most until ``deadline`` (monotonic).
    A directory, FIFO, socket or device is ``regular: False`` (measured as nothing)."""
    fd = _open_under(where)
    if fd is None:
        return {"exists": False}
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        return {"exists": True, "regular": False}
    with os.fdopen(fd, "rb") as f:
        head = f.read(SNIFF_BYTES)
        whole = head + f.read(SMALL - len(head)) if st.st_size <= SMALL else None
        digest = hashlib.sha256(whole if whole is not None else head) if want_hash else None
        read = len(whole) if whole is not None else len(head)
        if want_hash and whole is None:
            while chunk := f.read(CHUNK):
                digest.update(chunk)  # type: ignore[union-attr]
                read += len(chunk)
                if time.monotonic() > deadline:
                    raise CannotAsk("timeout", f"hashing {str(where)!r} took longer than the check timeout")
                if max_bytes is not None and read > max_bytes:
                    raise CannotAsk("too_large", f"{str(where)!r} is larger than max_body_bytes={max_bytes}")
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
