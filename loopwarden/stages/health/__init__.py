"""The health stage: step events and outcome receipts in, per-run health transitions out (the rules over Kafka)."""
