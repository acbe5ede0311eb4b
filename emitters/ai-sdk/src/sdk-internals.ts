/**
 * Everything this package knows about the AI SDK that the SDK does not publish as API.
 *
 * Each item below was checked against `ai`'s public surface (its `index.d.ts`, 7.0.149–7.0.173)
 * for a public replacement; where one exists the package uses it, and what is left lives here and
 * nowhere else. `test/sdk-internals.test.mjs` checks every assumption against the installed SDK and
 * fails naming the one that broke, so an SDK upgrade that changes any of them is caught by
 * `npm test` rather than by a wrong verdict in production.
 *
 * 1. `agent.settings.stopWhen`: ToolLoopAgent keeps its settings in a `private readonly settings`
 *    field and exposes only `id` and `tools`. The policy must be read once at `instrument()`
 *    (run_started carries it before the first step); no hook gives it earlier.
 * 2. The defaults of `stopWhen`: ToolLoopAgent's `isStepCount(20)` and generateText/streamText's
 *    `isStepCount(1)` (documented in prose, not exported). An agent without `stopWhen` runs its
 *    default unwrapped, so the SDK's own warning about it still logs.
 * 3. When the SDK evaluates `stopWhen` (`shouldStartNextStep`, not exported): only needed for that
 *    unwrapped default; wherever the conditions are our wrappers the evaluation is observed.
 * 4. Recognising the SDK's own `isStepCount`/`hasToolCall`/`isLoopFinished` closures by their
 *    source text and reading their parameters back by probing them with fake step lists: the
 *    closures carry no data. This package's factories of the same names remember what they are
 *    and need none of this; plain SDK closures are recognised as a convenience.
 * 5. `streamText` results' `_steps` delayed promise: it rejects on abort, timeout and error
 *    without consuming the stream (the public `steps` getter starts consuming it; the public
 *    `onError`/`onAbort` options would replace the caller's and change `streamRetries`' behaviour).
 * 6. `agent.settings.prepareCall` (same private field as item 1): a ToolLoopAgent's `prepareCall` may
 *    return another `stopWhen` per call, and no hook shows what it returned. An agent that has one
 *    is run through a copy made from its own settings (`new agent.constructor(settings)`, the
 *    documented constructor) whose `prepareCall` calls the user's and tells the emitter what it
 *    returned; the user's agent object is never modified.
 */
import {
  hasToolCall as sdkHasToolCall,
  isLoopFinished as sdkIsLoopFinished,
  isStepCount as sdkIsStepCount,
  type StopCondition,
} from 'ai';

type AnyStopCondition = StopCondition<any, any>;

// --- 1. the agent's stopWhen ---------------------------------------------------------------------

/** `{ found: false }` when the object has no readable ToolLoopAgent settings. */
export function agentStopWhen(agent: unknown): { found: true; stopWhen: unknown } | { found: false } {
  const settings = (agent as { settings?: unknown } | null)?.settings;
  if (settings == null || typeof settings !== 'object') return { found: false };
  return { found: true, stopWhen: (settings as { stopWhen?: unknown }).stopWhen };
}

/**
 * A copy of the agent whose `prepareCall` is `wrap(the agent's own)`, or undefined when the agent
 * has no `prepareCall` (item 6).
 */
export function withPrepareCall(agent: unknown, wrap: (original: (args: any) => unknown) => (args: any) => unknown): unknown {
  const settings = (agent as { settings?: Record<string, unknown> } | null)?.settings;
  const original = settings?.prepareCall;
  if (typeof original !== 'function') return undefined;
  const Agent = (agent as { constructor: new (settings: Record<string, unknown>) => unknown }).constructor;
  return new Agent({ ...settings, prepareCall: wrap(original.bind(undefined) as (args: any) => unknown) });
}

// --- 2. and 3. the default cap and when the SDK evaluates -----------------------------------------

/** ToolLoopAgent's default `stopWhen`: `isStepCount(DEFAULT_AGENT_STEP_CAP)`. */
export const DEFAULT_AGENT_STEP_CAP = 20;

/** What `sdkEvaluatesAfter` needs of a step. */
export interface EvaluatedStep {
  finish_reason: string;
  tool_calls: ReadonlyArray<{ status: string; provider_executed?: boolean }>;
}

/**
 * Whether the SDK evaluates `stopWhen` after this step (ai 7, `shouldStartNextStep`): the finish
 * reason is not `interrupted`, and either the step has client tool calls and every one of them
 * has a result, an error (cancelled included) or a denial, or a provider-executed call awaits its
 * deferred result, or (experimental steering, ai >= 7.0.154) it has none, a
 * steering message was waiting and it did not finish with `error`. Any other finish reason than
 * `interrupted` qualifies, not only `stop`/`tool-calls` (measured by test/oracle/sdk-oracle.mjs).
 */
export function sdkEvaluatesAfter(step: EvaluatedStep | undefined, steered = false): boolean {
  if (step === undefined || step.finish_reason === 'interrupted') return false;
  // Provider-executed calls need no outcome of their own; one still awaiting its deferred result
  // makes the SDK evaluate as a client call would (`pendingDeferredToolCalls`).
  const client = step.tool_calls.filter((c) => c.provider_executed !== true);
  const deferred = step.tool_calls.some((c) => c.provider_executed === true && c.status === 'pending');
  if (client.length === 0) return deferred || (steered && step.finish_reason !== 'error');
  // A tool interrupted by the run's abort or timeout ends as a tool-error part: an outcome too.
  return client.every((c) => c.status === 'result' || c.status === 'error' || c.status === 'denied' || c.status === 'cancelled');
}

/** generateText/streamText's default `stopWhen` (one step), as the SDK's own closure. */
export function textDefaultStopWhen(): AnyStopCondition {
  return sdkIsStepCount(1);
}

/** Whether the unwrapped default cap fires on these steps (the SDK's own isStepCount). */
export function defaultCapFires(steps: readonly unknown[]): boolean {
  return sdkIsStepCount(DEFAULT_AGENT_STEP_CAP)({ steps: steps as never }) === true;
}

// --- 4. plain SDK closures -------------------------------------------------------------------------

// The source text of the installed SDK's closures: a closure whose text is identical was made by
// that factory (or is a textually identical copy, which behaves the same).
const FINGERPRINT = {
  stepCount: sdkIsStepCount(1).toString(),
  toolCall: sdkHasToolCall('x').toString(),
  loopFinished: sdkIsLoopFinished().toString(),
};
const MAX_PROBED_STEP_COUNT = 100_000;

export type RecognisedClosure =
  | { kind: 'loop_finished' }
  | { kind: 'step_count'; count: number }
  | { kind: 'tool_call'; tools: string[] }
  | undefined;

/**
 * A plain SDK closure's kind and parameters, or undefined. `hasToolCall` is read back only for the
 * tool names given (those the agent has): the closure can only be asked, not inspected.
 */
export function recogniseSdkClosure(condition: AnyStopCondition, toolNames: readonly string[]): RecognisedClosure {
  const source = Function.prototype.toString.call(condition);
  if (source === FINGERPRINT.loopFinished) return { kind: 'loop_finished' };
  if (source === FINGERPRINT.stepCount) {
    for (let n = 0; n <= MAX_PROBED_STEP_COUNT; n += 1) {
      if (condition({ steps: { length: n } as never }) === true) return { kind: 'step_count', count: n };
    }
    return undefined;
  }
  if (source === FINGERPRINT.toolCall) {
    const tools = toolNames.filter((toolName) => condition({ steps: [{ toolCalls: [{ toolName }] }] as never }) === true);
    return tools.length > 0 ? { kind: 'tool_call', tools } : undefined;
  }
  return undefined;
}

// --- 5. a stream's steps without consuming it ----------------------------------------------------

/** The promise of a streamText result's steps that does not start consuming it, if there is one. */
export function streamStepsPromise(result: unknown): Promise<unknown> | undefined {
  const delayed = (result as { _steps?: { promise?: unknown } } | null)?._steps?.promise;
  return delayed != null && typeof (delayed as Promise<unknown>).then === 'function' ? (delayed as Promise<unknown>) : undefined;
}
