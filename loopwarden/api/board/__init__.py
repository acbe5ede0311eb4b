"""The runs board: a fleet view of agent.health in the browser (`loopwarden board`)."""
