"""The imperative shell on Kafka: the consume -> fold -> produce loop, store and recovery, assignment, HTTP, metrics, config."""
