"""The CLI's command families on Kafka; ``loopwarden.cli`` is the one entry point that adds them."""
