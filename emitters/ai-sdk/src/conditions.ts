/**
 * Stop conditions that know what they are.
 *
 * The AI SDK's `isStepCount(20)` returns an anonymous closure: nothing in it says "step count 20".
 * loopwarden needs the policy as data (docs/contract.md, Condition), so this module offers factories with
 * the SDK's names that return *the SDK's own condition* and remember its description in a
 * WeakMap. Plain SDK closures are still recognised (see `describeCondition`), but only the
 * factories are guaranteed across SDK versions; anything opaque must be named with
 * `namedCondition`.
 */
import {
  hasToolCall as sdkHasToolCall,
  isLoopFinished as sdkIsLoopFinished,
  isStepCount as sdkIsStepCount,
  type StopCondition,
  type ToolSet,
} from 'ai';
import { conditionIds, LIMITS, type Condition, type ConditionRole, CONDITION_ROLES } from './events.js';
import { LoopwardenConfigError } from './errors.js';
import { recogniseSdkClosure } from './sdk-internals.js';

export type AnyStopCondition = StopCondition<any, any>;

const described = new WeakMap<object, Condition>();

function remember<T extends AnyStopCondition>(condition: T, description: Condition): T {
  described.set(condition, description);
  return condition;
}

function requireInt(value: unknown, min: number, what: string): number {
  if (typeof value !== 'number' || !Number.isSafeInteger(value) || value < min) {
    throw new LoopwardenConfigError(`${what} must be an integer >= ${min}, got ${String(value)}`);
  }
  return value;
}

/** The SDK's `isStepCount(count)`, remembered as `step_count:<count>` (a bound). */
export function isStepCount(count: number): AnyStopCondition {
  requireInt(count, 0, 'isStepCount(count)');
  return remember(sdkIsStepCount(count), { kind: 'step_count', count });
}

/** Alias of `isStepCount`, as in the SDK. */
export const stepCountIs = isStepCount;

/** The SDK's `hasToolCall(...tools)`, remembered as `tool_call:<tool>` per tool (a completion). */
export function hasToolCall<TOOLS extends ToolSet = ToolSet>(
  ...tools: Array<keyof TOOLS | (string & {})>
): StopCondition<TOOLS, any> {
  const names = tools.map(String);
  if (names.length === 0 || names.length > LIMITS.toolCallTools) {
    throw new LoopwardenConfigError(`hasToolCall(...tools) needs 1–${LIMITS.toolCallTools} tool names, got ${names.length}`);
  }
  const bad = names.find((n) => n.length === 0 || [...n].length > LIMITS.id);
  if (bad !== undefined) throw new LoopwardenConfigError(`hasToolCall: tool names must be 1–${LIMITS.id} characters, got ${JSON.stringify(bad)}`);
  return remember(sdkHasToolCall(...names), { kind: 'tool_call', tools: names });
}

/** The SDK's `isLoopFinished()` (never fires; removes the 20-step default cap). */
export function isLoopFinished(): AnyStopCondition {
  return remember(sdkIsLoopFinished(), { kind: 'loop_finished' });
}

interface UsageLike {
  inputTokens?: number | undefined;
  outputTokens?: number | undefined;
  totalTokens?: number | undefined;
}

/** Tokens of one step as docs/contract.md counts them: total, else input + output, missing = 0. */
export function stepTokens(usage: UsageLike | undefined): number {
  if (usage == null) return 0;
  if (typeof usage.totalTokens === 'number') return usage.totalTokens;
  return (usage.inputTokens ?? 0) + (usage.outputTokens ?? 0);
}

/**
 * Stop once the call's steps used at least `maxTokens` tokens (a bound). The SDK has no such
 * condition; this is the one loopwarden can re-evaluate (`token_budget:<maxTokens>`). Like any
 * condition it is checked after a step, so a run may overshoot by one step.
 */
export function tokenBudget(maxTokens: number): AnyStopCondition {
  requireInt(maxTokens, 1, 'tokenBudget(maxTokens)');
  const condition: AnyStopCondition = ({ steps }) =>
    steps.reduce((sum: number, step: { usage?: UsageLike }) => sum + stepTokens(step.usage), 0) >= maxTokens;
  return remember(condition, { kind: 'token_budget', max_tokens: maxTokens });
}

/**
 * Name an opaque condition so that loopwarden can record it: `custom:<name>`, with its role
 * (`bound`: a limit was hit, the work may be unfinished; `completion`: the agent signalled done).
 * Returns a new condition that calls `condition` and returns its result unchanged.
 */
export function namedCondition<TOOLS extends ToolSet = ToolSet>(
  name: string,
  role: ConditionRole,
  condition: StopCondition<TOOLS, any>,
): StopCondition<TOOLS, any> {
  if (typeof name !== 'string' || name.length === 0 || [...name].length > LIMITS.id) {
    throw new LoopwardenConfigError(`namedCondition(name, ...) needs a name of 1–${LIMITS.id} characters, got ${JSON.stringify(name)}`);
  }
  if (!(CONDITION_ROLES as readonly string[]).includes(role)) {
    throw new LoopwardenConfigError(`namedCondition role must be 'bound' or 'completion', got ${String(role)}`);
  }
  if (typeof condition !== 'function') {
    throw new LoopwardenConfigError(`namedCondition('${name}', ...) needs a condition function`);
  }
  const named: StopCondition<TOOLS, any> = (options) => condition(options);
  return remember(named, { kind: 'custom', name, role });
}

// --- recognising plain SDK closures: see sdk-internals.ts (item 4) -------------------------------

function rememberDescription(condition: AnyStopCondition, description: Condition): Condition {
  remember(condition, description);
  return description;
}

/** What `describeCondition` needs to know about the agent. */
export interface DescribeContext {
  /** Tool names the agent has, used to read back a plain `hasToolCall(...)`. */
  toolNames: readonly string[];
  /** Where the condition sits, for error messages (e.g. `stopWhen[1]`). */
  where: string;
}

/**
 * The docs/contract.md Condition of one stop condition.
 *
 * Recognised: conditions made by this package's factories, and the installed SDK's
 * `isStepCount`/`stepCountIs`, `isLoopFinished` and `hasToolCall` closures (the last only for
 * tool names of the agent). Anything else throws LoopwardenConfigError asking for
 * `namedCondition`.
 */
export function describeCondition(condition: unknown, context: DescribeContext): Condition {
  if (typeof condition !== 'function') {
    throw new LoopwardenConfigError(`${context.where} is not a stop condition function`);
  }
  const known = described.get(condition);
  if (known) return known;
  const fn = condition as AnyStopCondition;
  const found = recogniseSdkClosure(fn, context.toolNames);
  if (found?.kind === 'loop_finished') return rememberDescription(fn, { kind: 'loop_finished' });
  if (found?.kind === 'step_count') return rememberDescription(fn, { kind: 'step_count', count: found.count });
  if (found?.kind === 'tool_call') {
    const tools = found.tools.filter((t) => t.length > 0 && [...t].length <= LIMITS.id);
    // Not remembered: another agent may have other tool names.
    if (tools.length > 0) return { kind: 'tool_call', tools };
  }
  throw new LoopwardenConfigError(
    `${context.where} is an opaque stop condition; wrap it as ` +
      `namedCondition('<name>', 'bound' | 'completion', condition) or build it with this ` +
      `package's isStepCount/hasToolCall/isLoopFinished/tokenBudget`,
  );
}

/** Condition ids that fired for one condition that returned true, given the steps it saw. */
export function firedIds(description: Condition, steps: ArrayLike<unknown>): string[] {
  if (description.kind !== 'tool_call') return conditionIds(description);
  const last = steps[steps.length - 1] as { toolCalls?: Array<{ toolName?: unknown }> } | undefined;
  const called = new Set((last?.toolCalls ?? []).map((call) => call.toolName));
  const matched = description.tools.filter((tool) => called.has(tool));
  return (matched.length > 0 ? matched : description.tools).map((tool) => `tool_call:${tool}`);
}
