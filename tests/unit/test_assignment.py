"""The group assignment's user data: owner URLs, and the output partition counts the group holds the layout to."""

from __future__ import annotations

import json

from aiokafka.coordinator.protocol import ConsumerProtocolMemberAssignment

from loopwarden.engine.assignment import CoPartitionedAssignor


class _Cluster:
    def partitions_for_topic(self, topic: str) -> set[int]:
        return set(range(4))


def _members(*assignors: CoPartitionedAssignor) -> dict:
    return {f"m{i}": a.metadata(["steps", "outcomes"]) for i, a in enumerate(assignors)}


def test_a_member_that_joins_gets_the_groups_output_counts_not_its_own_reading() -> None:
    """Two members hold agent.health to 4, a new one (nothing held yet) joins: every member is told 4."""
    old, other, new = CoPartitionedAssignor("http://a"), CoPartitionedAssignor("http://b"), CoPartitionedAssignor("http://c")
    old.outputs = other.outputs = {"agent.health": 4, "agent.deadletter": 4}
    assignment = old.assign(_Cluster(), _members(old, other, new))
    for member, a in zip(("m0", "m1", "m2"), (old, other, new)):
        a.on_assignment(assignment[member])
        assert a.group_outputs == {"agent.health": 4, "agent.deadletter": 4}
    assert sorted(new.owners) == [0, 1, 2, 3] and set(new.owners.values()) == {"http://a", "http://b", "http://c"}


def test_members_that_disagree_get_the_count_most_hold_and_an_earlier_versions_data_still_reads() -> None:
    """Counts 4, 4, 1: the group holds 4; a member of an earlier version (URL alone) and its owner-map-only
    assignment still read: its URL and its owner map."""
    a, b, c = (CoPartitionedAssignor(u) for u in ("http://a", "http://b", "http://c"))
    a.outputs, b.outputs, c.outputs = {"h": 4}, {"h": 4}, {"h": 1}
    members = _members(a, b, c)
    members["m3"] = CoPartitionedAssignor("http://old").metadata(["steps"])  # no outputs held: the URL alone
    assignment = a.assign(_Cluster(), members)
    data = json.loads(assignment["m3"].user_data)
    assert data["outputs"] == {"h": 4} and "http://old" in data["owners"].values()
    legacy = ConsumerProtocolMemberAssignment(1, [("steps", [0])], json.dumps({"0": "http://x"}).encode())
    c.on_assignment(legacy)
    assert c.owners == {0: "http://x"} and c.group_outputs == {}
