"""The stages the engine runs, one folder each: its task and fold, its state codec, its config and metrics."""
