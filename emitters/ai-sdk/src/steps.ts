/**
 * Content-free reading of SDK step results, and the stop cause as the integration boundary sees it.
 *
 * Only ids, names, statuses, finish reasons and token counts are read: never text, tool inputs
 * or outputs. Nothing here throws on an unexpected shape; it degrades to `other`/`pending`/null.
 */
import {
  FINISH_REASONS,
  LIMITS,
  type Approval,
  type Cause,
  type FinishReason,
  type ToolCallRecord,
  type Usage,
} from './events.js';

/** The content-free part of one step, as published in `step_finished`. */
export interface StepSummary {
  step: number;
  finish_reason: FinishReason;
  tool_calls: ToolCallRecord[];
  usage: Usage;
  /** approval id per tool call id, for calls whose status is `approval_requested`. */
  approvalIds: Map<string, string>;
  /** what interrupted the step's `cancelled` calls (a timeout wins over an abort), or null */
  cancelledBy: 'aborted' | 'timeout' | null;
}

type Part = Record<string, unknown> & { type?: unknown };

/** An identifier kept within the wire limits (1–200 characters). */
export function clipId(value: unknown): string {
  const text = typeof value === 'string' ? value : String(value ?? '');
  return text.length === 0 ? '-' : [...text].slice(0, LIMITS.id).join('');
}

function optionalText(value: unknown, max: number): string | null {
  return typeof value === 'string' && value.length > 0 && [...value].length <= max ? value : null;
}

function tokenCount(value: unknown): number | null {
  return typeof value === 'number' && Number.isSafeInteger(value) && value >= 0 ? value : null;
}

function finishReasonOf(value: unknown): FinishReason {
  return (FINISH_REASONS as readonly unknown[]).includes(value) ? (value as FinishReason) : 'other';
}

/**
 * Summarise an SDK StepResult (from `onStepEnd`/`onStepFinish` or `result.steps`).
 *
 * Status of each tool call, from the step's content parts: a `tool-error` whose error is an
 * abort or timeout (`AbortError`, `TimeoutError`, or wrapping one) → cancelled (the run's own
 * abort or timeout interrupted the tool: not a tool error); another `tool-error` → error;
 * `tool-result` → result; a denying `tool-approval-response` → denied; a user (non-automatic)
 * `tool-approval-request` → approval_requested; otherwise pending. Provider-executed calls are
 * listed with `provider_executed: true` (the SDK counts them in hasToolCall).
 */
export function summarizeStep(step: unknown, fallbackStepNumber = 0): StepSummary {
  const s = (step ?? {}) as Record<string, unknown>;
  const content = Array.isArray(s.content) ? (s.content as Part[]) : [];
  const calls: Array<{ id: string; name: string; provider: boolean }> = [];
  const errors = new Set<string>();
  const cancelled = new Map<string, 'aborted' | 'timeout'>();
  const results = new Set<string>();
  const denied = new Set<string>();
  const requested = new Map<string, string>();
  for (const part of content) {
    if (part == null || typeof part !== 'object') continue;
    switch (part.type) {
      case 'tool-call':
        if (typeof part.toolCallId === 'string') {
          calls.push({ id: part.toolCallId, name: clipId(part.toolName), provider: part.providerExecuted === true });
        }
        break;
      case 'tool-error':
        if (typeof part.toolCallId === 'string') {
          const names = errorNames(part.error);
          if (names.includes('TimeoutError')) cancelled.set(part.toolCallId, 'timeout');
          else if (names.includes('AbortError')) cancelled.set(part.toolCallId, 'aborted');
          else errors.add(part.toolCallId);
        }
        break;
      case 'tool-result':
        if (typeof part.toolCallId === 'string' && part.preliminary !== true) results.add(part.toolCallId);
        break;
      case 'tool-approval-request': {
        const id = (part.toolCall as { toolCallId?: unknown } | undefined)?.toolCallId;
        if (typeof id === 'string' && part.isAutomatic !== true && typeof part.approvalId === 'string') {
          requested.set(id, part.approvalId);
        }
        break;
      }
      case 'tool-approval-response': {
        const id = (part.toolCall as { toolCallId?: unknown } | undefined)?.toolCallId;
        if (typeof id === 'string' && part.approved === false) denied.add(id);
        break;
      }
      default:
        break;
    }
  }
  const approvalIds = new Map<string, string>();
  let cancelledBy: StepSummary['cancelledBy'] = null;
  const toolCalls = calls.slice(0, LIMITS.toolCalls).map(({ id, name, provider }): ToolCallRecord => {
    let status: ToolCallRecord['status'] = 'pending';
    if (cancelled.has(id)) {
      status = 'cancelled';
      if (cancelledBy !== 'timeout') cancelledBy = cancelled.get(id)!;
    } else if (errors.has(id)) status = 'error';
    else if (results.has(id)) status = 'result';
    else if (denied.has(id)) status = 'denied';
    else if (requested.has(id)) {
      status = 'approval_requested';
      approvalIds.set(clipId(id), requested.get(id)!);
    }
    return provider ? { id: clipId(id), name, status, provider_executed: true } : { id: clipId(id), name, status };
  });
  const usage = (s.usage ?? {}) as Record<string, unknown>;
  return {
    step: tokenCount(s.stepNumber) ?? fallbackStepNumber,
    finish_reason: finishReasonOf(s.finishReason),
    tool_calls: toolCalls,
    usage: {
      input_tokens: tokenCount(usage.inputTokens),
      output_tokens: tokenCount(usage.outputTokens),
      total_tokens: tokenCount(usage.totalTokens),
    },
    approvalIds,
    cancelledBy,
  };
}

function errorNames(error: unknown): string[] {
  // An error may wrap the abort reason (RetryError.lastError, Error.cause): look one level in.
  const names: string[] = [];
  const seen = new Set<unknown>();
  const queue: unknown[] = [error];
  while (queue.length > 0 && names.length < 8) {
    const e = queue.shift();
    if (e == null || typeof e !== 'object' || seen.has(e)) continue;
    seen.add(e);
    const name = (e as { name?: unknown }).name;
    if (typeof name === 'string') names.push(name);
    queue.push((e as { cause?: unknown }).cause, (e as { lastError?: unknown }).lastError);
  }
  return names;
}

/** What ended a `generate()`/`stream()` call, as observed at the boundary. */
export type CallOutcome =
  /** `streamError`: an error part the stream carried (a provider failure the call survived) */
  | { kind: 'resolved'; streamError?: unknown }
  | { kind: 'rejected'; error: unknown; signalAborted: boolean };

export interface BoundaryVerdict {
  cause: Cause;
  errorName: string | null;
  /** set when cause is approval_required: the first approval request of the last step */
  approvalRequest: { approvalId: string; toolCallId: string; toolName: string } | null;
}


/**
 * The cause of one segment, as derived at the boundary.
 *
 * A rejected call: TimeoutError → timeout; an aborted signal or AbortError → aborted; else error.
 * A resolved call, on its last step L: no steps → unknown; an approval request →
 * approval_required; a call cancelled by an abort or timeout → aborted / timeout (the SDK turned
 * it into a tool error and may even have stopped on a condition: the run was still interrupted);
 * an error part in the stream, or L finished with `error` → error (the provider failed); a tool
 * error → tool_error; stopWhen evaluated after L (observed by the wrapped conditions) →
 * stop_condition when something fired, else unknown; no client tool calls or a finish reason
 * other than stop/tool-calls → natural_finish; a pending call → unexecuted_tool.
 */
export function deriveBoundaryCause(
  outcome: CallOutcome,
  steps: readonly StepSummary[],
  evaluation: { evaluatedAtLast: boolean; fired: readonly string[] },
): BoundaryVerdict {
  if (outcome.kind === 'rejected') {
    const names = errorNames(outcome.error);
    const first = names[0] === undefined ? null : [...names[0]].slice(0, LIMITS.errorName).join('');
    if (names.includes('TimeoutError')) return { cause: 'timeout', errorName: 'TimeoutError', approvalRequest: null };
    if (outcome.signalAborted || names.includes('AbortError')) {
      return { cause: 'aborted', errorName: first ?? 'AbortError', approvalRequest: null };
    }
    return { cause: 'error', errorName: first, approvalRequest: null };
  }
  const last = steps[steps.length - 1];
  if (last === undefined) return { cause: 'unknown', errorName: null, approvalRequest: null };
  const requested = last.tool_calls.find((call) => call.status === 'approval_requested');
  if (requested) {
    return {
      cause: 'approval_required',
      errorName: null,
      approvalRequest: {
        approvalId: clipId(last.approvalIds.get(requested.id) ?? requested.id),
        toolCallId: requested.id,
        toolName: requested.name,
      },
    };
  }
  const verdict = (cause: Cause): BoundaryVerdict => ({ cause, errorName: null, approvalRequest: null });
  if (last.cancelledBy === 'timeout') return { cause: 'timeout', errorName: 'TimeoutError', approvalRequest: null };
  if (last.cancelledBy === 'aborted') return { cause: 'aborted', errorName: 'AbortError', approvalRequest: null };
  if (outcome.streamError !== undefined || last.finish_reason === 'error') {
    const names = errorNames(outcome.streamError);
    const first = names[0] === undefined ? null : [...names[0]].slice(0, LIMITS.errorName).join('');
    return { cause: 'error', errorName: first, approvalRequest: null };
  }
  const client = last.tool_calls.filter((call) => call.provider_executed !== true);
  if (client.some((call) => call.status === 'error')) return verdict('tool_error');
  if (evaluation.evaluatedAtLast) return verdict(evaluation.fired.length > 0 ? 'stop_condition' : 'unknown');
  if (client.length === 0 || (last.finish_reason !== 'stop' && last.finish_reason !== 'tool-calls')) {
    return verdict('natural_finish');
  }
  if (client.some((call) => call.status === 'pending')) return verdict('unexecuted_tool');
  return verdict('unknown');
}

/** The wire Approval of an approval request plus the application's routing data. */
export function approvalOf(
  request: { approvalId: string; toolCallId: string; toolName: string },
  routing: { owner?: string | null; deadlineTs?: number | null; resumeToken?: string | null } | null | undefined,
): Approval {
  return {
    approval_id: clipId(request.approvalId),
    tool_call_id: clipId(request.toolCallId),
    tool_name: clipId(request.toolName),
    // Routing data outside the wire limits is dropped (null): the run then shows as unrouted.
    owner: optionalText(routing?.owner, LIMITS.id),
    deadline_ts:
      typeof routing?.deadlineTs === 'number' && Number.isSafeInteger(routing.deadlineTs) && routing.deadlineTs >= 0
        ? routing.deadlineTs
        : null,
    resume_token: optionalText(routing?.resumeToken, LIMITS.resumeToken),
  };
}
