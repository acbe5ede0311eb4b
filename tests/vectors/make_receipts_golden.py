"""Write tests/vectors/receipts-golden.json: receipts signed by Python, for TypeScript to verify.

Each case holds the receipt as sent (JSON, signed), the canonical bytes its signature covers
(``loopwarden.codecs.canonical``), and the public key. Ed25519 is deterministic and the key is
fixed, so the file is reproducible: a unit test fails while it differs from what this prints.
The TypeScript side writes ``emitters/ai-sdk/test/vectors/ts-receipts-golden.json`` the same way
(``npm run vectors``) and ``tests/unit/test_receipts.py`` verifies it here.

Run ``python -m tests.vectors.make_receipts_golden`` after changing the canonical form.
"""

from __future__ import annotations

import json
import sys

import msgspec
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from loopwarden.codecs import OutcomeReceipt, encode, receipt_signing_bytes
from loopwarden.trust import SigningKey

PATH = Path(__file__).with_name("receipts-golden.json")
SEED = bytes(range(32))  # a test key: never trust it anywhere
TS = 1_780_000_000_000

# Values both languages must write identically: integers up to 2**53 - 1, floats in every
# notation ECMAScript's Number::toString picks, escapes, and keys in UTF-16 code-unit order.
EVIDENCE = [
    {},
    {"size": 1024, "sha256": "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08", "content_type": "application/pdf"},
    {"int_max": 2**53 - 1, "int_min": -(2**53 - 1), "zero": 0, "neg_zero": -0.0, "one_float": 1.0, "half": 0.5},
    {"tenth": 0.1, "sum": 0.1 + 0.2, "third": 1 / 3, "big": 1e21, "below_big": 1e20 + 16384.0, "tiny": 1e-7,
     "small": 1e-6, "min": 5e-324, "max": 1.7976931348623157e308, "neg": -123.456, "e_mid": 4.35e-10},
    {"ctl": "a\u0000b\u001fc\"d\\e\nf\tg\rh\bi\fj\u007f", "uni": "é€😀 \u2028", "slash": "a/b"},
    {"\u20ac": 1, "\U0001F600": 2, "\uff61": 3, "a": 4, "B": 5, "": 6, "aa": 7, "\u00e9": 8},
    {"flag": True, "no": False},
]


# Cases (by index) whose receipt names the occurrence it answers (run_started_ts, signed when present).
BOUND = {0: TS - 60_000, 1: TS - 1}


def cases() -> list[dict]:
    key = SigningKey("golden-py", Ed25519PrivateKey.from_private_bytes(SEED))
    out = []
    for i, evidence in enumerate([*EVIDENCE, *(EVIDENCE[i] for i in BOUND)]):
        receipt = OutcomeReceipt(run_id=f"golden-{i}", ts=TS + i, receipt_id=f"rc-{i}", kind="file",
                                 verifier="destination", verified=i % 2 == 0, evidence=evidence)
        if i >= len(EVIDENCE):
            receipt = msgspec.structs.replace(receipt, run_started_ts=BOUND[i - len(EVIDENCE)])
        signed = key.sign(receipt)
        out.append({"receipt": encode(signed).decode(), "canonical": receipt_signing_bytes(receipt).decode()})
    return out


def render() -> str:
    key = SigningKey("golden-py", Ed25519PrivateKey.from_private_bytes(SEED))
    return json.dumps({"trusted": key.setting, "cases": cases()}, indent=1, ensure_ascii=True) + "\n"


if __name__ == "__main__":
    PATH.write_text(render())
    sys.stdout.write(f"wrote {len(EVIDENCE) + len(BOUND)} signed receipts to {PATH}\n")
