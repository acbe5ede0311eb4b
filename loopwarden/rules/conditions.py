"""Stop conditions with the AI SDK's exact semantics, and the derived stop cause.

The SDK (``ai`` 7) evaluates ``stopWhen`` only when the loop could otherwise
continue, and its built-ins are::

    isStepCount(n)   = ({steps}) => steps.length === n            // equality
    hasToolCall(...) = ({steps}) => steps.at(-1)?.toolCalls?.some(name in tools)
    isLoopFinished() = () => false

Everything here is a pure function of small values; nothing keeps step records.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence

from loopwarden.codecs.events import (
    DEFAULT_POLICY_CONDITIONS,
    Condition,
    Custom,
    Policy,
    StepCount,
    StepFinished,
    TokenBudget,
    ToolCall,
    ToolCallCondition,
)

CONTINUING_FINISH = ("stop", "tool-calls")
# A tool call in one of these states has an outcome the model can see, so the
# loop may go on; `pending` and `approval_requested` end it. `cancelled` (the run's own abort or
# timeout interrupted the tool) is a tool-error part to the SDK, so it evaluates stopWhen after it.
SETTLED_STATUSES = ("result", "error", "denied", "cancelled")


def conditions_of(policy: Policy | None) -> tuple[Condition, ...]:
    """The conditions in force: ``stop_when``, or the ToolLoopAgent default cap."""
    if policy is None or policy.stop_when is None:
        return DEFAULT_POLICY_CONDITIONS
    return policy.stop_when


class CompiledPolicy:
    """A policy's values in the form the per-event code needs, computed once per distinct policy.

    Durations in whole ms; the conditions in force as lookup tables: step counts
    (count -> id), tool names (name -> id), token budgets ((max_tokens, id), ...),
    the declared ids' roles and the declared custom ids.
    """

    __slots__ = ("conditions", "inactivity_ms", "window_ms", "step_ids", "tool_ids", "budgets",
                 "roles", "custom_ids")

    def __init__(self, policy: Policy | None) -> None:
        effective = policy if policy is not None else _DEFAULT_POLICY
        self.conditions = conditions = conditions_of(policy)
        self.inactivity_ms = int(round(effective.inactivity_timeout_s * 1000))
        self.window_ms = int(round(effective.receipt_window_s * 1000))
        step_ids: dict[int, str] = {}
        tool_ids: dict[str, str] = {}
        budgets: list[tuple[int, str]] = []
        for cond in conditions:
            if isinstance(cond, StepCount):
                step_ids[cond.count] = cond.ids[0]
            elif isinstance(cond, ToolCallCondition):
                for tool in cond.tools:
                    tool_ids[tool] = f"tool_call:{tool}"
            elif isinstance(cond, TokenBudget):
                budgets.append((cond.max_tokens, cond.ids[0]))
        self.step_ids = step_ids
        self.tool_ids = tool_ids
        self.budgets = tuple(budgets)
        self.roles = declared_ids(conditions)
        self.custom_ids = frozenset(cid for cid in self.roles if cid.startswith("custom:"))

    def evaluate(self, steps_in_segment: int, segment_tokens: int, last_calls: Iterable[ToolCall]) -> tuple[str, ...]:
        """As :func:`evaluate` on this policy's conditions, given the last step's tool calls."""
        cid = self.step_ids.get(steps_in_segment)
        tool_ids, budgets = self.tool_ids, self.budgets
        if not tool_ids and not budgets:  # step counts only (the default policy): at most one id
            return () if cid is None else (cid,)
        fired = [] if cid is None else [cid]  # few ids: a list's `in` is cheaper than a set
        if tool_ids:
            for call in last_calls:
                cid = tool_ids.get(call.name)
                if cid is not None and cid not in fired:
                    fired.append(cid)
        for max_tokens, cid in budgets:
            if segment_tokens >= max_tokens and cid not in fired:
                fired.append(cid)
        if len(fired) > 1:
            fired.sort()
        return tuple(fired)


_DEFAULT_POLICY = Policy(version="")
# Distinct policies of a fleet are few; a producer sending a new one per run only
# makes the memo start over now and then, never grow without bound.
_COMPILED_MAX = 4096
_COMPILED: dict[Policy | None, tuple[Policy | None, CompiledPolicy]] = {}
# id of a policy held as a key of _COMPILED (so the id cannot be reused) -> its compiled form
_BY_ID: dict[int, CompiledPolicy] = {}


def _memo(policy: Policy | None) -> tuple[Policy | None, CompiledPolicy]:
    try:
        return _COMPILED[policy]
    except KeyError:
        pass
    except TypeError:  # an unhashable policy (built by hand with lists): compiled every time
        return policy, CompiledPolicy(policy)
    if len(_COMPILED) >= _COMPILED_MAX:
        _COMPILED.clear()
        _BY_ID.clear()
    entry = _COMPILED[policy] = (policy, CompiledPolicy(policy))
    _BY_ID[id(policy)] = entry[1]
    return entry


def intern_policy(policy: Policy | None) -> Policy | None:
    """An equal policy shared by every run that has it (runs keep one object, not one each)."""
    if id(policy) in _BY_ID:  # the shared object itself: a key of _COMPILED, so no other object has its id
        return policy  # not hashed again (a policy with a recovery policy hashes that too: ~0.3 µs)
    return _memo(policy)[0]


def compile_policy(policy: Policy | None) -> CompiledPolicy:
    """The :class:`CompiledPolicy` of ``policy`` (None: the default policy), memoized by value."""
    compiled = _BY_ID.get(id(policy))
    if compiled is not None:
        return compiled
    return _memo(policy)[1]


def loop_statuses(calls: Sequence[ToolCall]) -> tuple[tuple[str, ...], bool]:
    """The statuses of a step's calls as the loop sees them, and whether they all settled.

    As ``ai`` 7 does (``shouldStartNextStep``): only client-executed calls must have an
    outcome; a step whose calls were all provider-executed ends the loop (as a step without
    tool calls does) unless one of them still awaits its deferred result, and then the loop
    evaluates ``stopWhen`` and may go on. So provider-executed calls give no status of their
    own, and a pending one counts as one settled call. Their names still count for
    ``hasToolCall`` (the caller evaluates the policy on all calls).
    """
    statuses = []
    deferred = False
    settled = True
    for call in calls:
        if call.provider_executed:
            deferred = deferred or call.status == "pending"
            continue
        statuses.append(call.status)
        if call.status not in SETTLED_STATUSES:
            settled = False
    if deferred and not statuses:
        statuses.append("result")
    return tuple(statuses), settled and bool(statuses)


def is_evaluated(step: StepFinished, steered: bool = False) -> bool:
    """Whether the SDK evaluates ``stopWhen`` after this step.

    As ``ai`` 7 does (``shouldStartNextStep``): the step has at least one client
    tool call, every call settled (result, error or denial), and the finish reason
    is not ``interrupted``; provider-executed calls as :func:`loop_statuses` says. The first contract named only ``stop``/``tool-calls`` here; the SDK
    also evaluates after e.g. a ``content-filter`` step whose calls were all denied
    or failed (measured by the differential oracle), and loopwarden follows the SDK.
    ``steered``: a steering message was waiting when the step ended (ai >= 7.0.154);
    the SDK then evaluates after a step without tool calls too, unless it finished
    with ``error`` (or ``interrupted``).
    """
    if step.finish_reason == "interrupted":
        return False
    statuses, settled = loop_statuses(step.tool_calls)
    if not statuses:
        return steered and step.finish_reason != "error"
    return settled


def evaluate(
    conditions: Iterable[Condition],
    steps_in_segment: int,
    segment_tokens: int,
    last_tool_names: Sequence[str],
) -> tuple[str, ...]:
    """Ids of the conditions that are true on a segment prefix, sorted.

    Parameters
    ----------
    conditions
        The policy's conditions.
    steps_in_segment
        ``steps.length`` at the evaluation (the SDK's 0-based step number + 1).
    segment_tokens
        Tokens summed over the segment's steps so far (see ``Usage.tokens``).
    last_tool_names
        Tool names called by the last step (whatever their status).
    """
    fired: set[str] = set()
    for cond in conditions:
        if isinstance(cond, StepCount):
            if steps_in_segment == cond.count:
                fired.add(cond.ids[0])
        elif isinstance(cond, ToolCallCondition):
            for tool in cond.tools:
                if tool in last_tool_names:
                    fired.add(f"tool_call:{tool}")
        elif isinstance(cond, TokenBudget):
            if segment_tokens >= cond.max_tokens:
                fired.add(cond.ids[0])
        # LoopFinished never fires; Custom cannot be evaluated here.
    return tuple(sorted(fired))


def declared_ids(conditions: Iterable[Condition]) -> dict[str, str]:
    """Map every condition id the policy declares to its role (``bound``/``completion``/``none``)."""
    roles: dict[str, str] = {}
    for cond in conditions:
        if isinstance(cond, (StepCount, TokenBudget)):
            role = "bound"
        elif isinstance(cond, ToolCallCondition):
            role = "completion"
        elif isinstance(cond, Custom):
            role = cond.role
        else:  # LoopFinished
            role = "none"
        for cid in cond.ids:
            roles[cid] = role
    return roles


def derive_cause(
    steps_seen: int,
    last_statuses: Sequence[str],
    last_finish_reason: str | None,
    fired_at_last: Sequence[str],
    reported_fired: Sequence[str],
    conditions: Sequence[Condition],
    custom_declared: Collection[str] | None = None,
    steered: bool = False,
) -> tuple[str, tuple[str, ...]]:
    """Re-derive a segment's stop cause from its steps (docs/contract.md section 5, with the SDK's rule).

    Rules 1-5 of docs/contract.md section 5 (3: a last step that finished with ``error`` derives ``error``); rule 4
    ("finish reason not stop/tool-calls") applies, as in
    the SDK, only where the loop could not have gone on: a step whose calls all
    settled under another finish reason was still evaluated (see :func:`is_evaluated`).
    Returns the derived cause and the derived fired set (empty under rules 1-5).
    ``custom_declared``, if given, is the set of custom ids ``conditions`` declare
    (see :class:`CompiledPolicy`), so it need not be worked out again. ``steered``: a
    steering message was waiting after the last step (``RunEnded.steered``), so the SDK
    evaluated stopWhen after it even without tool calls (unless its finish was ``error``
    or ``interrupted``); ``fired_at_last`` is then the policy's result at that step.
    """
    if steps_seen == 0:
        return "unknown", ()
    if "approval_requested" in last_statuses:
        return "approval_required", ()
    if last_finish_reason == "error":  # rule 3: the provider failed mid-step
        return "error", ()
    if last_finish_reason == "interrupted":
        return "natural_finish", ()
    if not last_statuses:
        if not steered or last_finish_reason == "error":
            return "natural_finish", ()
        # steered: the SDK evaluated stopWhen after this step without tool calls (see RunEnded.steered);
        # `fired_at_last` must then be what the policy gives at it
        return _fired_cause(fired_at_last, reported_fired, conditions, custom_declared)
    if any(status not in SETTLED_STATUSES for status in last_statuses):  # a call has no result
        if last_finish_reason not in CONTINUING_FINISH:
            return "natural_finish", ()  # the model's finish: tools were not run
        return "unexecuted_tool", ()  # an explicit done signal
    return _fired_cause(fired_at_last, reported_fired, conditions, custom_declared)


def _fired_cause(
    fired_at_last: Sequence[str],
    reported_fired: Sequence[str],
    conditions: Sequence[Condition],
    custom_declared: Collection[str] | None,
) -> tuple[str, tuple[str, ...]]:
    """Rule 5: stop_condition with what fired at the last evaluation (and reported customs), else unknown."""
    if custom_declared is None:
        custom_declared = {cid for cid in declared_ids(conditions) if cid.startswith("custom:")}
    if not (reported_fired and custom_declared) and len(fired_at_last) <= 1:  # nothing to merge or sort
        if fired_at_last:
            return "stop_condition", tuple(fired_at_last)
        return "unknown", ()
    fired = set(fired_at_last)
    fired.update(cid for cid in reported_fired if cid in custom_declared)
    if fired:
        return "stop_condition", tuple(sorted(fired))
    return "unknown", ()
