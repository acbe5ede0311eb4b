"""The read side, off the hot path: the read API (runs, peers, metrics over HTTP) and the runs board."""
