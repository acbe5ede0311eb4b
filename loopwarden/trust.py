"""Trusted receipts (docs/contract.md section 10, docs/receipts.md): keys, signing, and the trust check
both shells run.

``LOOPWARDEN_TRUSTED_VERIFIERS`` names the keys whose receipts count, as comma-separated
``KEY_ID=PUBLIC_KEY`` pairs, ``PUBLIC_KEY`` being the base64url (no padding) of a raw 32-byte
Ed25519 public key: what ``loopwarden keys new`` prints. The worker and ``loopwarden replay`` hand
each decoded receipt to :meth:`ReceiptTrust.classify` before the core applies it: the core gets a
:class:`~loopwarden.rules.trust.TrustedReceipt` (counts; its evidence says how it was trusted) or an
:class:`~loopwarden.rules.trust.UntrustedReceipt` (kept in evidence, counted, changes no state).

``LOOPWARDEN_TRUSTED_OUTCOMES_TOPIC`` names a second receipts topic that, by the cluster's ACLs, only
the verifiers' principals may write: a receipt read from it is trusted by its channel, with no
per-message signature check (Kafka authenticated its producer once per connection). Receipts on the
outcomes topic are then checked by signature as above; with the channel set and no trusted key,
none of them counts. With neither setting there is no check: every receipt counts.
"""

from __future__ import annotations

import base64
import binascii
import os
import re
from pathlib import Path

import msgspec
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from loopwarden.codecs import NotCanonical, OutcomeReceipt, Signature, receipt_signing_bytes
from loopwarden.codecs.events import OperatorAction
from loopwarden.codecs.canonical import action_signing_bytes
from loopwarden.rules.trust import TrustedAction, TrustedReceipt, UntrustedAction, UntrustedReceipt

ENV = "LOOPWARDEN_TRUSTED_VERIFIERS"
_KEY_ID = re.compile(r"^[A-Za-z0-9._:@-]{1,200}$")


class TrustConfigError(ValueError):
    """A trusted-verifiers setting or a key file that cannot be used (the message names the value)."""


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def unb64url(text: str) -> bytes:
    """Strict base64url without padding (raises ValueError on anything else)."""
    if not re.fullmatch(r"[A-Za-z0-9_-]*", text) or len(text) % 4 == 1:
        raise ValueError(f"not base64url: {text[:60]!r}")
    try:
        return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError) as exc:
        raise ValueError(f"not base64url: {text[:60]!r}") from exc


def public_key_text(key: Ed25519PublicKey) -> str:
    return b64url(key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw))


class TrustedVerifiers:
    """The keys whose signed receipts count: key id -> Ed25519 public key."""

    def __init__(self, keys: dict[str, Ed25519PublicKey]) -> None:
        if not keys:
            raise TrustConfigError(f"{ENV}: names no key (expected KEY_ID=PUBLIC_KEY[,KEY_ID=PUBLIC_KEY...])")
        self.keys = dict(keys)

    @classmethod
    def parse(cls, text: str, name: str = ENV) -> "TrustedVerifiers":
        """Parse ``KEY_ID=PUBLIC_KEY[,...]``; raises TrustConfigError naming the bad entry."""
        keys: dict[str, Ed25519PublicKey] = {}
        for entry in text.split(","):
            entry = entry.strip()
            if not entry:
                continue
            key_id, sep, key_text = entry.partition("=")
            key_id, key_text = key_id.strip(), key_text.strip()
            if not sep or not _KEY_ID.match(key_id):
                raise TrustConfigError(f"{name}: entry {entry[:80]!r} is not KEY_ID=PUBLIC_KEY "
                                       "(KEY_ID: 1-200 chars of [A-Za-z0-9._:@-])")
            if key_id in keys:
                raise TrustConfigError(f"{name}: key id {key_id!r} is given twice")
            try:
                raw = unb64url(key_text)
                if len(raw) != 32:
                    raise ValueError(f"{len(raw)} bytes")
                keys[key_id] = Ed25519PublicKey.from_public_bytes(raw)
            except ValueError:
                raise TrustConfigError(f"{name}: the public key of {key_id!r}, {key_text[:60]!r}, is not the base64url "
                                       "of a 32-byte Ed25519 public key (as `loopwarden keys new` prints)") from None
        return cls(keys)

    @classmethod
    def from_env(cls, environ: dict | None = None) -> "TrustedVerifiers | None":
        """The setting from the environment, or None when unset (every receipt counts)."""
        text = (os.environ if environ is None else environ).get(ENV, "")
        return cls.parse(text) if text.strip() else None

    def why_untrusted(self, receipt: OutcomeReceipt) -> str | None:
        """None when a trusted key signed exactly this receipt; else why not (a bounded code)."""
        sig = receipt.signature
        if sig is msgspec.UNSET:
            return "unsigned"
        key = self.keys.get(sig.key_id)
        if key is None:
            return "unknown_key"
        try:
            raw = unb64url(sig.sig)
            payload = receipt_signing_bytes(receipt)
        except NotCanonical:
            return "not_canonical"
        except ValueError:
            return "bad_signature"
        if len(raw) != 64:
            return "bad_signature"
        try:
            key.verify(raw, payload)
        except InvalidSignature:
            return "bad_signature"
        return None

    def classify_action(self, action: OperatorAction) -> TrustedAction | UntrustedAction:
        """A person's operator action, trusted when one of these keys signed exactly it (docs/recovery.md)."""
        sig = action.signature
        if sig is msgspec.UNSET:
            return UntrustedAction(action, "unsigned")
        key = self.keys.get(sig.key_id)
        if key is None:
            return UntrustedAction(action, "unknown_key")
        try:
            raw = unb64url(sig.sig)
            payload = action_signing_bytes(action)
        except NotCanonical:
            return UntrustedAction(action, "not_canonical")
        except ValueError:
            return UntrustedAction(action, "bad_signature")
        try:
            if len(raw) != 64:
                raise InvalidSignature
            key.verify(raw, payload)
        except InvalidSignature:
            return UntrustedAction(action, "bad_signature")
        by = "person:" + sig.key_id
        return TrustedAction(action, by if action.actor is msgspec.UNSET else f"{by}/{action.actor}")

    def classify(self, receipt: OutcomeReceipt) -> TrustedReceipt | UntrustedReceipt:
        why = self.why_untrusted(receipt)
        if why is None:
            return TrustedReceipt(receipt, "key:" + receipt.signature.key_id)  # type: ignore[union-attr]
        return UntrustedReceipt(receipt, why)  # type: ignore[arg-type]


class ReceiptTrust:
    """How a shell decides trust in a receipt: by the channel it came on, else by its signature.

    ``verifiers``: the trusted keys (LOOPWARDEN_TRUSTED_VERIFIERS) or None; ``channel``: the topic only the
    verifiers may write (LOOPWARDEN_TRUSTED_OUTCOMES_TOPIC) or None. :meth:`build` gives None when
    both are unset: no check, every receipt counts (the shells then hand receipts over as they are)."""

    __slots__ = ("verifiers", "channel", "by_channel")

    def __init__(self, verifiers: TrustedVerifiers | None, channel: str | None) -> None:
        self.verifiers = verifiers
        self.channel = channel
        self.by_channel = None if channel is None else "channel:" + channel

    @classmethod
    def build(cls, verifiers: TrustedVerifiers | None, channel: str | None) -> "ReceiptTrust | None":
        return None if verifiers is None and channel is None else cls(verifiers, channel)

    def classify(self, receipt: OutcomeReceipt, on_channel: bool = False) -> TrustedReceipt | UntrustedReceipt:
        """``on_channel``: the receipt was read from the trusted channel (no per-message check)."""
        if on_channel:
            return TrustedReceipt(receipt, self.by_channel)  # type: ignore[arg-type]
        verifiers = self.verifiers
        if verifiers is None:  # the channel is the only way in: no key is trusted
            return UntrustedReceipt(receipt, "unsigned" if receipt.signature is msgspec.UNSET else "unknown_key")
        return verifiers.classify(receipt)


class SigningKey:
    """A verifier's private key and its id: signs receipts."""

    def __init__(self, key_id: str, private_key: Ed25519PrivateKey) -> None:
        if not _KEY_ID.match(key_id):
            raise TrustConfigError(f"key id {key_id!r} must be 1-200 chars of [A-Za-z0-9._:@-]")
        self.key_id = key_id
        self.private_key = private_key

    @classmethod
    def generate(cls, key_id: str) -> "SigningKey":
        return cls(key_id, Ed25519PrivateKey.generate())

    @classmethod
    def load(cls, path: str | os.PathLike) -> "SigningKey":
        """Read a key file written by :meth:`save` (``loopwarden keys new``)."""
        try:
            text = Path(path).read_text()
        except OSError as exc:
            raise TrustConfigError(f"signing key {str(path)!r}: cannot read: {exc.strerror}") from None
        key_id = None
        for line in text.splitlines():
            if line.startswith("# key_id: "):
                key_id = line[len("# key_id: "):].strip()
        pem = "\n".join(line for line in text.splitlines() if not line.startswith("#")).encode()
        try:
            key = serialization.load_pem_private_key(pem, password=None)
        except (ValueError, TypeError) as exc:
            raise TrustConfigError(f"signing key {str(path)!r}: not a PEM private key ({exc})") from None
        if not isinstance(key, Ed25519PrivateKey):
            raise TrustConfigError(f"signing key {str(path)!r}: not an Ed25519 key")
        if key_id is None:
            raise TrustConfigError(f"signing key {str(path)!r}: no '# key_id: ...' line")
        return cls(key_id, key)

    def save(self, path: str | os.PathLike) -> None:
        """Write the private key (PEM, PKCS#8) with its key id, readable by the owner only (0600)."""
        pem = self.private_key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                             serialization.NoEncryption())
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(f"# key_id: {self.key_id}\n".encode() + pem)
        os.chmod(path, 0o600)  # whatever the umask

    @property
    def public_text(self) -> str:
        return public_key_text(self.private_key.public_key())

    @property
    def setting(self) -> str:
        """This key's entry in LOOPWARDEN_TRUSTED_VERIFIERS."""
        return f"{self.key_id}={self.public_text}"

    def sign_action(self, action: OperatorAction) -> OperatorAction:
        """The operator action with ``signature`` set (any previous signature replaced)."""
        sig = self.private_key.sign(action_signing_bytes(action))
        return msgspec.structs.replace(action, signature=Signature(key_id=self.key_id, sig=b64url(sig)))

    def sign(self, receipt: OutcomeReceipt) -> OutcomeReceipt:
        """The receipt with ``signature`` set (any previous signature replaced)."""
        sig = self.private_key.sign(receipt_signing_bytes(receipt))
        return msgspec.structs.replace(receipt, signature=Signature(key_id=self.key_id, sig=b64url(sig)))
