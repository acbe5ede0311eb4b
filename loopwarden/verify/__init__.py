"""``loopwarden verify``: destination verifiers and trusted receipts (spec.md section 10; docs/receipts.md)."""
