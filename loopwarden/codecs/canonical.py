"""The canonical bytes a receipt's signature covers (docs/contract.md section 10), defined once here.

The form is RFC 8785 (JSON Canonicalization Scheme) over the JSON value of the receipt without
its ``signature``: object keys sorted by their UTF-16 code units, no whitespace, strings escaped
as ECMAScript's ``JSON.stringify`` escapes them, numbers as ECMAScript's ``Number.prototype.toString``
writes them. TypeScript gets the same bytes with ``JSON.stringify`` of key-sorted objects
(``emitters/ai-sdk/src/receipts.ts``); golden vectors in ``tests/vectors/receipts-golden.json``
hold both languages to it.

Only values both languages represent exactly are canonical: an integer beyond
±(2**53 - 1) or a float that is not finite raises :class:`NotCanonical` (such a receipt
cannot be verified, so it never counts as trusted).
"""

from __future__ import annotations

import json
import re
from decimal import Decimal

import msgspec
from typing import Any
from msgspec import UNSET

from loopwarden.codecs.events import OperatorAction, OutcomeReceipt

MAX_SAFE_INT = 2**53 - 1
# The fields of a receipt the signature covers: every wire field but `signature`, defaults included
# (an absent `evidence` is signed as {}), unknown fields never (a decoder drops them); `run_started_ts`
# when it is present (absent, the bytes are those of a receipt without it).
SIGNED_FIELDS = ("type", "run_id", "ts", "receipt_id", "kind", "verifier", "verified", "evidence", "run_started_ts")

_SHORT = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


class NotCanonical(ValueError):
    """A value that has no canonical form both languages agree on (named in the message)."""


_dumps_str = json.JSONEncoder(ensure_ascii=False).encode
_sorted_json = msgspec.json.Encoder(order="sorted").encode
_SURROGATES = re.compile("[\ud800-\udfff]")


def _string(s: str) -> str:
    # Python's JSON string escapes are JSON.stringify's (the short ones, other controls as
    # lower-case \u00xx, nothing else) except for lone surrogates, which take the slow path.
    if not _SURROGATES.search(s):
        return _dumps_str(s)
    out = ['"']
    for ch in s:
        code = ord(ch)
        if ch in _SHORT:
            out.append(_SHORT[ch])
        elif code < 0x20 or 0xD800 <= code <= 0xDFFF:  # controls; lone surrogates as JSON.stringify (ES2019)
            out.append(f"\\u{code:04x}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def number(x: int | float) -> str:
    """``x`` as ECMAScript's Number::toString writes it (RFC 8785 section 3.2.2.3)."""
    if isinstance(x, int):
        if not -MAX_SAFE_INT <= x <= MAX_SAFE_INT:
            raise NotCanonical(f"integer {x} is beyond ±(2**53 - 1): not exact in JavaScript")
        return str(x)
    if x != x or x in (float("inf"), float("-inf")):
        raise NotCanonical(f"number {x!r} is not finite")
    if x == 0:
        return "0"
    if x < 0:
        return "-" + number(-x)
    # repr is the shortest string that round-trips, as ECMAScript's digits are.
    _sign, digits_t, exp = Decimal(repr(x)).as_tuple()
    digits = "".join(map(str, digits_t)).rstrip("0")
    exp += len(digits_t) - len(digits)  # trailing zeros moved into the exponent
    k = len(digits)
    n = exp + k  # x = 0.digits * 10**n
    if k <= n <= 21:
        return digits + "0" * (n - k)
    if 0 < n <= 21:
        return digits[:n] + "." + digits[n:]
    if -6 < n <= 0:
        return "0." + "0" * (-n) + digits
    e = n - 1
    mantissa = digits if k == 1 else digits[0] + "." + digits[1:]
    return f"{mantissa}e{'+' if e >= 0 else '-'}{abs(e)}"


def _value(v: Any, out: list[str]) -> None:
    if v is None:
        out.append("null")
    elif v is True:
        out.append("true")
    elif v is False:
        out.append("false")
    elif isinstance(v, (int, float)):
        out.append(number(v))
    elif isinstance(v, str):
        out.append(_string(v))
    elif isinstance(v, dict):
        out.append("{")
        # Code-point order is UTF-16 order unless a key holds a character above U+FFFF.
        keys = sorted(v) if all(isinstance(k, str) and k.isascii() for k in v) else sorted(v, key=_utf16)
        for i, key in enumerate(keys):
            if not isinstance(key, str):
                raise NotCanonical(f"object key {key!r} is not a string")
            if i:
                out.append(",")
            out.append(_string(key))
            out.append(":")
            _value(v[key], out)
        out.append("}")
    elif isinstance(v, (list, tuple)):
        out.append("[")
        for i, item in enumerate(v):
            if i:
                out.append(",")
            _value(item, out)
        out.append("]")
    else:
        raise NotCanonical(f"value of type {type(v).__name__} has no canonical JSON form")


def _utf16(key: Any) -> bytes:
    return key.encode("utf-16-be", "surrogatepass") if isinstance(key, str) else b""


def canonical_json(value: Any) -> bytes:
    """RFC 8785 bytes of a JSON value (dict, list, str, int, float, bool, None).

    Raises
    ------
    NotCanonical
        For an integer beyond ±(2**53 - 1), a non-finite float or a non-JSON value.
    """
    out: list[str] = []
    _value(value, out)
    return "".join(out).encode("utf-8", "surrogatepass")


def receipt_signing_bytes(receipt: OutcomeReceipt) -> bytes:
    """The bytes a receipt's ``signature.sig`` is an Ed25519 signature over.

    Raises
    ------
    NotCanonical
        When the receipt's evidence holds a value without a canonical form.
    """
    evidence = receipt.evidence
    doc = {
        "type": "outcome_receipt",
        "run_id": receipt.run_id,
        "ts": receipt.ts,
        "receipt_id": receipt.receipt_id,
        "kind": receipt.kind,
        "verifier": receipt.verifier,
        "verified": receipt.verified,
        "evidence": evidence,
    }
    if receipt.run_started_ts is not UNSET:  # the occurrence it answers; absent: not in the signed bytes
        doc["run_started_ts"] = receipt.run_started_ts
    # The common case, in C: ASCII keys (code-point order is then UTF-16 order) and no floats (their
    # notation differs) nor integers beyond 2**53: msgspec's sorted JSON is then exactly RFC 8785
    # (its string escapes are JSON.stringify's; a lone surrogate raises and takes the slow path).
    if all(k.isascii() for k in evidence) and all(
        type(v) is not float and (type(v) is not int or -MAX_SAFE_INT <= v <= MAX_SAFE_INT) for v in evidence.values()
    ):
        try:
            return _sorted_json(doc)
        except UnicodeEncodeError:
            pass
    return canonical_json(doc)



def action_signing_bytes(action: OperatorAction) -> bytes:
    """The bytes an operator action's ``signature.sig`` is an Ed25519 signature over (docs/contract.md
    section 12): the action's canonical JSON (RFC 8785) without ``signature``; absent fields stay absent."""
    doc = msgspec.to_builtins(action)
    doc.pop("signature", None)
    return canonical_json(doc)
