"""``loopwarden verify``: destination verifiers and trusted receipts (docs/contract.md section 10; docs/receipts.md)."""
