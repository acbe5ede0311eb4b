"""Content type by sniffing the first bytes (never trusting a name or a header): one job."""

from __future__ import annotations

import json

_MAGIC = (
    (b"%PDF-", "application/pdf"),
    (b"\x89PNG\r\n\x1a\n", "image/png"),
    (b"\xff\xd8\xff", "image/jpeg"),
    (b"GIF87a", "image/gif"),
    (b"GIF89a", "image/gif"),
    (b"PK\x03\x04", "application/zip"),
    (b"\x1f\x8b", "application/gzip"),
    (b"SQLite format 3\x00", "application/vnd.sqlite3"),
)
SNIFF_BYTES = 4096


def sniff(head: bytes, whole: bytes | None = None) -> str:
    """The media type of a document from its first bytes (``whole``: all of it, when small enough
    to tell JSON from text by parsing)."""
    for magic, media in _MAGIC:
        if head.startswith(magic):
            return media
    if b"\x00" in head:
        return "application/octet-stream"
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError as exc:
        if exc.start < len(head) - 4:  # not a multi-byte character cut at the end of the head
            return "application/octet-stream"
        text = head[: exc.start].decode("utf-8")
    stripped = text.lstrip()
    if stripped[:1] in ("{", "[") and whole is not None:
        try:
            json.loads(whole)
            return "application/json"
        except ValueError:
            pass
    return "text/plain"
