"""Where trust in a receipt is decided (docs/contract.md section 10), as the core sees it.

The shells decide trust, not the core: before a decoded ``outcome_receipt`` is applied, a shell
with ``LOOPWARDEN_TRUSTED_VERIFIERS`` or ``LOOPWARDEN_TRUSTED_OUTCOMES_TOPIC`` set decides it
(``loopwarden.trust``: by the channel the receipt came on, or by its signature) and hands the core
either a :class:`TrustedReceipt` saying how it was trusted or an :class:`UntrustedReceipt` naming why
not. With neither setting the shell hands over the receipt itself: it counts. Checking a
signature is pure computation, but the keys are configuration, and the core stays a function of
events alone: the same untrusted receipt gives the same result in the worker and in replay.

Whether a receipt answers the run's current occurrence is the core's own rule, for every receipt that
would count (trusted by key or channel, or with no setting): one stamped before the occurrence
started is kept as ``untrusted_stale`` (``loopwarden.rules.machine``, docs/contract.md section 10).
"""

from __future__ import annotations

from typing import Literal

from msgspec import Struct

from loopwarden.codecs.events import OperatorAction, OutcomeReceipt

# Why a receipt is not trusted; a bounded set (metric label).
UntrustedWhy = Literal["unsigned", "unknown_key", "bad_signature", "not_canonical"]
UNTRUSTED_WHY: tuple[str, ...] = UntrustedWhy.__args__  # type: ignore[attr-defined]


class _Classified(Struct, frozen=True, gc=False):
    """A receipt a shell classified before the core applies it; the core reads its run id and ts."""

    receipt: OutcomeReceipt

    @property
    def run_id(self) -> str:
        return self.receipt.run_id

    @property
    def ts(self) -> int:
        return self.receipt.ts


class UntrustedReceipt(_Classified, frozen=True, gc=False):
    """A receipt a shell found untrusted: kept in the run's evidence, counted, and changes no state."""

    why: UntrustedWhy


class TrustedReceipt(_Classified, frozen=True, gc=False):
    """A receipt a shell trusted, and how (kept in the run's evidence): ``channel:<topic>`` (it came on a
    topic only the verifiers may write) or ``key:<key_id>`` (a trusted key signed it)."""

    by: str


class _ClassifiedAction(Struct, frozen=True, gc=False):
    """A person's operator action a shell classified by its signature (docs/contract.md section 12): the same
    keys as human receipts (LOOPWARDEN_TRUSTED_VERIFIERS). The core reads its run id and ts."""

    action: OperatorAction

    @property
    def run_id(self) -> str:
        return self.action.run_id

    @property
    def ts(self) -> int:
        return self.action.ts


class UntrustedAction(_ClassifiedAction, frozen=True, gc=False):
    """An operator action no trusted key signed: it changes nothing, and is counted."""

    why: UntrustedWhy


class TrustedAction(_ClassifiedAction, frozen=True, gc=False):
    """An operator action a trusted key signed; ``by`` is its ``decided_by``: ``person:<key id>`` (and
    ``/<actor>`` when the signer names its user)."""

    by: str
