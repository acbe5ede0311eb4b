"""Real agent runtimes on their own test models (no model calls): their spans through the bridge and replay."""

from __future__ import annotations

import importlib

import pytest

from loopwarden.codecs import RunEnded, RunStarted, StepFinished
from tests.otel.bridge import final_by_agent, in_memory, one_per_span, replay, through_bridge
from tests.otel.pydantic_ai_runs import SECRET


@pytest.mark.parametrize("runtime", ["genai_runs", "pydantic_ai_runs", "openai_agents_runs", "langgraph_runs",
                                     "adk_runs"])
def test_runtime_runs_reach_their_states_in_memory(runtime):
    """Each scenario's spans (encoded as the OTLP exporter does, one message per span) give its expected state."""
    scenarios = importlib.import_module(f"tests.otel.{runtime}")
    provider, exporter = in_memory()
    expected = scenarios.run(provider)
    b = through_bridge(one_per_span(exporter.get_finished_spans()))
    assert b.deadletters == []
    assert final_by_agent(b.events()) == {e.agent: (e.state, e.reason) for e in expected}
    assert all(SECRET.encode() not in o.value for o in b.outputs)


@pytest.mark.parametrize("runtime", ["openai_agents_runs", "langgraph_runs"])
def test_a_hung_run_starts_at_its_first_spans_and_goes_stuck(runtime):
    """A run that hangs (its run span never ends) is published from the spans that ended, and goes STUCK."""
    scenarios = importlib.import_module(f"tests.otel.{runtime}")
    provider, exporter = in_memory()
    expected, spans = scenarios.hung(provider, exporter.get_finished_spans)
    b = through_bridge(one_per_span(spans), after_ms=31_000)  # the start grace: only the run span names the agent
    events = b.events()
    (started,) = [e for e in events if isinstance(e, RunStarted)]
    assert started.agent == expected.agent
    assert [(t.to_state, t.reason) for t in replay(events, advance_s=400).final.values()] == [
        (expected.state, expected.reason)]



def _subgraph_runs(parents_first: bool) -> tuple[dict, dict, dict, dict, dict]:
    """The LangGraph sub-graph scenario through the bridge, one message per span, in end or start order:
    each run's steps (finish reason, tool names), (cause, step count), final (state, reason), the expected
    final states, and each run's id."""
    from tests.otel import langgraph_runs

    provider, exporter = in_memory()
    expected = langgraph_runs.subgraph(provider)
    spans = list(exporter.get_finished_spans())
    if parents_first:
        spans.sort(key=lambda s: s.start_time)
    events = through_bridge(one_per_span(spans)).events()
    agents = {e.run_id: e.agent for e in events if isinstance(e, RunStarted)}
    steps: dict[str, list] = {}
    for e in events:
        if isinstance(e, StepFinished):
            steps.setdefault(agents[e.run_id], []).append((e.finish_reason, [c.name for c in e.tool_calls]))
    ended = {agents[e.run_id]: (e.cause, e.step_count) for e in events if isinstance(e, RunEnded)}
    final = final_by_agent(events)
    ids = {agent: run for run, agent in agents.items()}
    return steps, ended, final, {e.agent: (e.state, e.reason) for e in expected}, ids


@pytest.mark.parametrize("parents_first", [False, True], ids=["as-they-end", "graph-spans-first"])
def test_a_langgraph_subgraph_invoked_in_a_node_is_a_run_of_its_own(parents_first):
    """A sub-graph a node invokes is its own run, its model calls and tool its steps, apart from its parent's."""
    steps, ended, final, expected, ids = _subgraph_runs(parents_first)
    assert steps == {"lg-subgraph-inner": [("tool-calls", ["lookup"]), ("stop", [])],
                     "lg-subgraph": [("stop", [])]}
    assert ended == {"lg-subgraph-inner": ("natural_finish", 2), "lg-subgraph": ("natural_finish", 1)}
    assert final == expected == {"lg-subgraph-inner": ("VERIFYING", "natural_finish"),
                                 "lg-subgraph": ("VERIFYING", "natural_finish")}
    # the thread the sub-graph's spans inherit names the parent's run; the sub-graph keeps its own id
    assert ids["lg-subgraph"] == "langgraph-thread:t-subgraph"
    assert ids["lg-subgraph-inner"].startswith("otel-")
