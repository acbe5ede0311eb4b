"""The stage-agnostic engine on Kafka: the loop, owned partitions and their lifecycle, checkpoint, restore,
alignment, assignment and the store. It runs any stage (``loopwarden.engine.stage``) and imports none."""
