"""The imperative shell on Kafka: the Faust app, topics, agents, table, timers, web views, metrics."""
