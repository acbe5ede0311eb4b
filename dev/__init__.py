"""Development harness: the local Apache Kafka broker and the `make dev` demo. Never shipped in the wheel."""
