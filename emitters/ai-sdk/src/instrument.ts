/**
 * Instrumenting ToolLoopAgent, generateText and streamText for one application-level run.
 *
 * Per `generate()`/`stream()` call (a *segment*), the instrumentation:
 * - adds its own `onStepEnd` (the SDK's `onStepFinish`) that publishes `step_finished` and then
 *   calls the caller's own per-call callback (the agent's settings callbacks are merged by the SDK);
 * - passes a per-call `stopWhen` whose conditions are the agent's own, each wrapped to record what
 *   it returned (same value, same timing), so `run_ended.fired` names what fired at the last
 *   evaluation; without a `stopWhen` the SDK's default cap is left untouched;
 * - wraps the call's promise, the only place an abort or timeout between steps is seen, and
 *   publishes `run_ended` with the cause derived as in steps.ts.
 * Everything it does is guarded: an internal failure is counted, the agent call proceeds as if
 * uninstrumented, and nothing waits for Kafka.
 */
import { AsyncLocalStorage } from 'node:async_hooks';
import { generateText, streamText, type ToolLoopAgent } from 'ai';
import { describeCondition, firedIds, type AnyStopCondition } from './conditions.js';
import { LoopwardenConfigError, LoopwardenResumeError } from './errors.js';
import {
  ActionHandlingStopped,
  type ActionSource,
  type ActionStats,
  type ActionSubscription,
  type OnActionOptions,
} from './actions.js';
import {
  decodeEvent,
  decodeRecoveryAction,
  encodeEvent,
  LoopwardenDecodeError,
  LIMITS,
  RECEIPT_KINDS,
  VERIFIERS,
  type Condition,
  type EvidenceValue,
  type OutcomeReceipt,
  type Policy,
  type ReceiptKind,
  type RecoveryAction,
  type RecoveryPolicy,
  type StepsEvent,
  type Verifier,
} from './events.js';
import { Publisher, PRIORITY, type PublisherOptions, type PublisherStats } from './publisher.js';
import type { Sink } from './sinks.js';
import {
  agentStopWhen,
  DEFAULT_AGENT_STEP_CAP,
  defaultCapFires,
  sdkEvaluatesAfter,
  streamStepsPromise,
  textDefaultStopWhen,
  withPrepareCall,
} from './sdk-internals.js';
import { approvalOf, clipId, deriveBoundaryCause, summarizeStep, type CallOutcome, type StepSummary } from './steps.js';

/** What the application is told when a segment stops for an approval. */
export interface ApprovalRequestInfo {
  runId: string;
  agent: string;
  segment: number;
  approvalId: string;
  toolCallId: string;
  toolName: string;
}

/** Routing data the application attaches to an approval request (all three make it WAITING). */
export interface ApprovalRouting {
  owner?: string | null;
  /** ms since the epoch */
  deadlineTs?: number | null;
  resumeToken?: string | null;
}

/** Called synchronously when a segment ends with `approval_required`; may return routing data. */
export type ApprovalRouter = (request: ApprovalRequestInfo) => ApprovalRouting | null | undefined;

/** Policy knobs other than `stop_when`, which is read from the agent / call. */
export interface PolicyOptions {
  /** Agent name on the wire (1–100 chars, a bounded set per fleet). Default: agent id, else 'agent'. */
  agent?: string;
  /** Recorded with every verdict. Default: the Loopwarden option, else 'unversioned'. */
  policyVersion?: string;
  inactivityTimeoutS?: number;
  receiptWindowS?: number;
  requiredOutcomes?: ReceiptKind[];
  /** What the job may do on its own when a run ends in a state (docs/contract.md section 12); default: none declared. */
  recovery?: RecoveryPolicy;
  routeApproval?: ApprovalRouter;
}

export interface LoopwardenOptions extends PolicyOptions, PublisherOptions {
  /**
   * How long a segment may go without a step while run_active keeps it from looking stuck
   * (seconds, default 3600): a model call or tool that hangs longer is left to go STUCK.
   */
  runActiveMaxS?: number;
  sink: Sink;
  /** Topic names; defaults `agent.steps` and `agent.outcomes`. */
  topics?: { steps?: string; outcomes?: string };
  /** Clock in ms since the epoch (default Date.now). */
  now?: () => number;
  /** Told about failures inside the instrumentation (they are counted and swallowed). */
  onInternalError?: (error: unknown) => void;
  /** Where `onAction` reads recovery actions (a KafkaActionSource on agent.actions). */
  actions?: ActionSource;
}

export interface RunOptions {
  /**
   * Segment number of the first call made through this handle. Default: where this client's last
   * handle of the same run id left off, else 0. A first call that resumes an approval on a handle
   * that would start at 0 throws LoopwardenConfigError (its events would be ignored as duplicates).
   */
  segment?: number;
  /** Publish run_started before the first call (default: only when `segment` is 0). */
  publishRunStarted?: boolean;
  /** Approval id the run is waiting for, when resuming in another process. */
  pendingApprovalId?: string;
  routeApproval?: ApprovalRouter;
  /**
   * The recovery action (resume or restart) this run carries out: its run_started names the job, the
   * attempt (the action's next_attempt) and the run it recovers, under the action's next_policy when it
   * has one (keeping this run's recovery policy when next_policy declares none).
   */
  recovers?: RecoveryAction;
}

export interface ReceiptInput {
  runId: string;
  receiptId: string;
  kind: ReceiptKind;
  verifier: Verifier;
  verified: boolean;
  evidence?: Record<string, EvidenceValue>;
  ts?: number;
}

export interface LoopwardenStats extends PublisherStats {
  /** failures inside the instrumentation, swallowed so the agent is never affected */
  internalErrors: number;
}


function checkRange(value: unknown, what: string, ok: (v: number) => boolean): void {
  if (value !== undefined && (typeof value !== 'number' || !ok(value))) {
    throw new LoopwardenConfigError(`${what} is invalid: ${String(value)}`);
  }
}

function checkPolicyOptions(options: PolicyOptions): void {
  if (options.agent !== undefined) {
    const length = [...String(options.agent)].length;
    if (typeof options.agent !== 'string' || length < 1 || length > 100) {
      throw new LoopwardenConfigError(`agent name must be 1–100 characters, got ${JSON.stringify(options.agent)}`);
    }
  }
  if (
    options.policyVersion !== undefined &&
    (typeof options.policyVersion !== 'string' || [...options.policyVersion].length > LIMITS.policyVersion)
  ) {
    throw new LoopwardenConfigError(`policyVersion must be a string of at most ${LIMITS.policyVersion} characters`);
  }
  const seconds = (v: number) => Number.isFinite(v) && v > 0 && v <= LIMITS.maxSeconds;
  checkRange(options.inactivityTimeoutS, 'inactivityTimeoutS (seconds)', seconds);
  checkRange(options.receiptWindowS, 'receiptWindowS (seconds)', seconds);
  const kinds = options.requiredOutcomes;
  if (
    kinds !== undefined &&
    (!Array.isArray(kinds) ||
      new Set(kinds).size !== kinds.length ||
      kinds.some((k) => !(RECEIPT_KINDS as readonly string[]).includes(k)))
  ) {
    throw new LoopwardenConfigError(`requiredOutcomes must be distinct receipt kinds (${RECEIPT_KINDS.join(', ')}), got ${JSON.stringify(kinds)}`);
  }
  if (options.recovery !== undefined) {
    try {
      decodeEvent({ type: 'run_started', run_id: '-', ts: 0, agent: '-', policy: { version: '-', recovery: options.recovery } });
    } catch (error) {
      if (!(error instanceof LoopwardenDecodeError)) throw error;
      const where = error.path.replace('$.policy.recovery', 'recovery');
      throw new LoopwardenConfigError(`${where} is invalid: ${error.message.replace(/ - at `.*`$/, '')}`);
    }
  }
}

function checkRecovers(runId: string, action: RecoveryAction | undefined): void {
  if (action === undefined) return;
  if (action == null || typeof action !== 'object' || typeof action.action_id !== 'string') {
    throw new LoopwardenConfigError('recovers must be a recovery action read by onAction');
  }
  if (typeof action.next_attempt !== 'number') {
    throw new LoopwardenConfigError(
      `recovers: action ${JSON.stringify(action.action_id)} is ${JSON.stringify(action.action)}: it starts no attempt (only resume and restart do)`,
    );
  }
  if (runId === action.run_id || runId === action.job_id) {
    throw new LoopwardenConfigError(
      `run id ${JSON.stringify(runId)} names an earlier attempt of job ${JSON.stringify(action.job_id)}: each attempt is a run with its own id`,
    );
  }
}

/** The policy an attempt that carries out `action` runs under (docs/contract.md section 12). */
function attemptPolicy(own: Policy, action: RecoveryAction | undefined): Policy {
  const next = action?.next_policy;
  if (!next) return own;
  return next.recovery === undefined && own.recovery !== undefined ? { ...next, recovery: own.recovery } : next;
}

// Not unref'd: an action waiting for its due time is work the application asked for (onAction runs until closed).
const sleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, Math.max(0, ms)));

function checkRunId(runId: unknown): asserts runId is string {
  const length = typeof runId === 'string' ? [...runId].length : 0;
  if (typeof runId !== 'string' || length < 1 || length > 200) {
    throw new LoopwardenConfigError(`runId must be a string of 1–200 characters, got ${JSON.stringify(runId)}`);
  }
}

/** A described stop policy: the wire conditions plus the SDK conditions to wrap per call. */
interface DescribedPolicy {
  stopWhen: Condition[] | null;
  /** null: no stopWhen given, the SDK's own default runs unwrapped */
  entries: Array<{ condition: AnyStopCondition; description: Condition }> | null;
}

function describeStopWhen(stopWhen: unknown, toolNames: readonly string[], label: string): DescribedPolicy {
  if (stopWhen === undefined || stopWhen === null) return { stopWhen: null, entries: null };
  const list = Array.isArray(stopWhen) ? stopWhen : [stopWhen];
  if (list.length > LIMITS.stopWhenItems) {
    throw new LoopwardenConfigError(`${label} has ${list.length} conditions; the wire allows ${LIMITS.stopWhenItems}`);
  }
  const entries = list.map((condition, i) => ({
    condition: condition as AnyStopCondition,
    description: describeCondition(condition, {
      toolNames,
      where: Array.isArray(stopWhen) ? `${label}[${i}]` : label,
    }),
  }));
  return { stopWhen: entries.map((e) => e.description), entries };
}

function approvalResponsesIn(messages: unknown): Array<{ approvalId: string; approved: boolean }> {
  // Only the trailing tool message(s): the answers this call resumes with, not older history.
  if (!Array.isArray(messages)) return [];
  const found: Array<{ approvalId: string; approved: boolean }> = [];
  for (let i = messages.length - 1; i >= 0; i -= 1) {
    const message = messages[i] as { role?: unknown; content?: unknown } | undefined;
    if (message?.role !== 'tool') break;
    const parts = Array.isArray(message.content) ? message.content : [];
    for (const part of parts as Array<Record<string, unknown>>) {
      if (part?.type === 'tool-approval-response' && typeof part.approvalId === 'string') {
        found.push({ approvalId: part.approvalId, approved: part.approved === true });
      }
    }
  }
  return found.reverse();
}

type Callback = ((event: unknown) => unknown) | undefined;

/** The client: one publisher, many runs. */
export class Loopwarden {
  readonly topics: { steps: string; outcomes: string };
  private readonly publisher: Publisher;
  private readonly now: () => number;
  private internalErrors = 0;
  /** next segment and run policy per run id, for handles made later for the same run (bounded) */
  private readonly segments = new Map<string, { next: number; policy: Policy | null }>();

  constructor(readonly options: LoopwardenOptions) {
    if (options == null || options.sink == null || typeof options.sink.send !== 'function') {
      throw new LoopwardenConfigError('createLoopwarden needs a sink (KafkaSink or MemorySink)');
    }
    checkPolicyOptions(options);
    this.topics = {
      steps: options.topics?.steps ?? 'agent.steps',
      outcomes: options.topics?.outcomes ?? 'agent.outcomes',
    };
    if (!this.topics.steps || !this.topics.outcomes) throw new LoopwardenConfigError('topic names must not be empty');
    this.publisher = new Publisher(options.sink, {
      ...options,
      // docs/contract.md section 11: a run that lost events is told so (events_dropped), on the steps topic
      lossReport: (key, count) => ({
        topic: this.topics.steps,
        key,
        value: encodeEvent({ type: 'events_dropped', run_id: key, ts: this.clock(), count }),
      }),
    });
    this.now = options.now ?? Date.now;
  }

  /** @internal The next segment of a run this client has seen, if it remembers it. */
  nextSegmentOf(runId: string): { next: number; policy: Policy | null } | undefined {
    return this.segments.get(runId);
  }

  /** @internal */
  rememberSegment(runId: string, next: number, policy: Policy | null): void {
    this.segments.delete(runId);
    this.segments.set(runId, { next, policy });
    if (this.segments.size > 10_000) this.segments.delete(this.segments.keys().next().value as string);
  }

  /** Guard for everything that runs inside an agent call. */
  internalError(error: unknown): void {
    this.internalErrors += 1;
    try {
      this.options.onInternalError?.(error);
    } catch {
      // the error hook itself failed: nothing else to do
    }
  }

  clock(): number {
    return Math.trunc(this.now());
  }

  /** Queue one agent.steps event. Never throws, never waits. */
  emit(event: StepsEvent): boolean {
    try {
      // The queue policy's ranks: run_active goes first when the queue is full, run_ended last.
      const priority =
        event.type === 'run_active' ? PRIORITY.liveness : event.type === 'run_ended' ? PRIORITY.end : PRIORITY.normal;
      return this.publisher.enqueue({ topic: this.topics.steps, key: event.run_id, value: encodeEvent(event) }, priority);
    } catch (error) {
      this.internalError(error);
      return false;
    }
  }

  policyFor(described: DescribedPolicy, options: PolicyOptions): Policy {
    const recovery = options.recovery ?? this.options.recovery;
    return {
      version: options.policyVersion ?? this.options.policyVersion ?? 'unversioned',
      stop_when: described.stopWhen,
      inactivity_timeout_s: options.inactivityTimeoutS ?? this.options.inactivityTimeoutS ?? 300,
      receipt_window_s: options.receiptWindowS ?? this.options.receiptWindowS ?? 600,
      required_outcomes: [...(options.requiredOutcomes ?? this.options.requiredOutcomes ?? [])],
      ...(recovery !== undefined ? { recovery } : {}),
    };
  }

  /**
   * Watch a ToolLoopAgent. Reads its `stopWhen` once and describes it (throws
   * LoopwardenConfigError for an opaque condition, at set-up time rather than in a run).
   */
  instrument<AGENT extends ToolLoopAgent<any, any, any, any>>(agent: AGENT, options: PolicyOptions = {}): WatchedAgent<AGENT> {
    checkPolicyOptions(options);
    const settings = agentStopWhen(agent); // no public accessor: see sdk-internals.ts (item 1)
    if (agent == null || typeof agent.generate !== 'function' || !settings.found) {
      throw new LoopwardenConfigError('instrument(agent) needs a ToolLoopAgent (its settings were not readable)');
    }
    const toolNames = Object.keys((agent.tools ?? {}) as object);
    const described = describeStopWhen(settings.stopWhen, toolNames, 'stopWhen');
    const name = options.agent ?? this.options.agent ?? agent.id ?? 'agent';
    checkPolicyOptions({ agent: name });
    // An agent with prepareCall may swap stopWhen per call: run it through a copy that tells us
    // what prepareCall returned (sdk-internals.ts, item 6).
    let runner: AGENT = agent;
    try {
      const copy = withPrepareCall(agent, (original) => async (args: Record<string, unknown>) => {
        const prepared = await original(args);
        const tracker = CURRENT_SEGMENT.getStore();
        return tracker ? tracker.prepared(args, prepared) : prepared;
      });
      if (copy) runner = copy as AGENT;
    } catch (error) {
      this.internalError(error);
    }
    return new WatchedAgent(this, agent, name, described, this.policyFor(described, options), options, runner);
  }

  /** A run driven by `generateText`/`streamText` directly (policy read from each call's options). */
  run(runId: string, options: PolicyOptions & RunOptions = {}): TextRun {
    checkRunId(runId);
    checkPolicyOptions(options);
    checkRecovers(runId, options.recovers);
    const name = options.agent ?? this.options.agent ?? 'agent';
    checkPolicyOptions({ agent: name });
    return new TextRun(this, runId, name, options);
  }

  /** Publish an outcome receipt on the outcomes topic (for destinations, validators, humans). */
  publishReceipt(receipt: ReceiptInput): boolean {
    checkRunId(receipt.runId);
    if (typeof receipt.receiptId !== 'string' || receipt.receiptId.length === 0 || [...receipt.receiptId].length > LIMITS.id) {
      throw new LoopwardenConfigError(`receiptId must be 1–${LIMITS.id} characters`);
    }
    const evidence = Object.entries(receipt.evidence ?? {});
    if (evidence.length > LIMITS.evidenceKeys) throw new LoopwardenConfigError(`evidence allows at most ${LIMITS.evidenceKeys} keys`);
    for (const [key, value] of evidence) {
      const okValue =
        typeof value === 'boolean' ||
        (typeof value === 'number' && Number.isFinite(value)) ||
        (typeof value === 'string' && value.length <= LIMITS.evidenceString);
      if (key.length > LIMITS.evidenceKey || !okValue) {
        throw new LoopwardenConfigError(`evidence[${JSON.stringify(key)}] must be a str (<= ${LIMITS.evidenceString}), number or bool under a key of <= ${LIMITS.evidenceKey} characters`);
      }
    }
    if (!(RECEIPT_KINDS as readonly string[]).includes(receipt.kind)) {
      throw new LoopwardenConfigError(`receipt kind must be one of ${RECEIPT_KINDS.join(', ')}`);
    }
    if (!(VERIFIERS as readonly string[]).includes(receipt.verifier)) {
      throw new LoopwardenConfigError(`verifier must be one of ${VERIFIERS.join(', ')}`);
    }
    const event: OutcomeReceipt = {
      type: 'outcome_receipt',
      run_id: receipt.runId,
      ts: receipt.ts ?? this.clock(),
      receipt_id: receipt.receiptId,
      kind: receipt.kind,
      verifier: receipt.verifier,
      verified: receipt.verified === true,
      evidence: { ...(receipt.evidence ?? {}) },
    };
    return this.publisher.enqueue({ topic: this.topics.outcomes, key: event.run_id, value: encodeEvent(event) });
  }

  /** Routing data for a pending approval, added after the segment ended. */
  approvalRouted(runId: string, approvalId: string, routing: ApprovalRouting): boolean {
    checkRunId(runId);
    const approval = approvalOf({ approvalId, toolCallId: '', toolName: '' }, routing);
    return this.emit({
      type: 'approval_routed',
      run_id: runId,
      ts: this.clock(),
      approval_id: approval.approval_id,
      owner: approval.owner,
      deadline_ts: approval.deadline_ts,
      resume_token: approval.resume_token,
    });
  }

  /** The decision on a pending approval (published automatically when a resume call carries it). */
  approvalResolved(runId: string, approvalId: string, approved: boolean): boolean {
    checkRunId(runId);
    return this.emit({ type: 'approval_resolved', run_id: runId, ts: this.clock(), approval_id: clipId(approvalId), approved: approved === true });
  }

  /**
   * Receive the recovery actions loopwarden publishes (docs/contract.md section 12) for this client's
   * agent (`options.agent` for another) and carry them out: each action once it is due (`not_before_ts`), repeats dropped by `action_id`, at least once (a
   * record is consumed only after `handler` returned; a handler that throws is called again with the
   * same action, with backoff). Start the next attempt with `run(newRunId, { recovers: action })`.
   */
  onAction(handler: (action: RecoveryAction) => unknown, options: OnActionOptions = {}): ActionSubscription {
    const source = options.source ?? this.options.actions;
    if (source == null || typeof source.start !== 'function') {
      throw new LoopwardenConfigError(
        'onAction needs an action source: createLoopwarden({ ..., actions: new KafkaActionSource({ brokers }) })',
      );
    }
    if (typeof handler !== 'function') throw new LoopwardenConfigError('onAction needs a handler function');
    const agent = options.agent ?? this.options.agent;
    if (agent === undefined) {
      throw new LoopwardenConfigError("onAction needs the agent whose actions it takes: createLoopwarden({ ..., agent }) or onAction(handler, { agent })");
    }
    checkPolicyOptions({ agent });
    const first = options.retryFirstMs ?? 500;
    const longest = options.retryMaxMs ?? 60_000;
    checkRange(first, 'retryFirstMs', (v) => Number.isFinite(v) && v >= 0);
    checkRange(longest, 'retryMaxMs', (v) => Number.isFinite(v) && v >= first);
    const stats: ActionStats = { handled: 0, repeats: 0, invalid: 0, skipped: 0, handlerErrors: 0 };
    const handled = new Map<string, true>(); // action ids handled, oldest first (bounded)
    let closed = false;
    const pause = async (ms: number, keepAlive: () => Promise<void>) => {
      // in slices, so that a long wait keeps the consumer's group membership and notices close()
      for (let left = ms; left > 0 && !closed; left -= 3_000) {
        await sleep(Math.min(left, 3_000));
        await keepAlive();
      }
      if (closed) throw new ActionHandlingStopped();
    };
    const handle = async (value: string, keepAlive: () => Promise<void>) => {
      if (closed) throw new ActionHandlingStopped();
      let action: RecoveryAction;
      try {
        action = decodeRecoveryAction(value);
      } catch (error) {
        stats.invalid += 1;
        this.internalError(error);
        return;
      }
      if (handled.has(action.action_id)) {
        stats.repeats += 1;
        return;
      }
      let accepted = action.agent === agent;
      try {
        if (accepted) accepted = options.accept?.(action) ?? true;
      } catch (error) {
        this.internalError(error);
      }
      if (!accepted) {
        stats.skipped += 1;
        return;
      }
      await pause(action.not_before_ts - this.clock(), keepAlive);
      for (let wait = first; ; wait = Math.min(wait * 2, longest)) {
        try {
          await handler(action);
          break;
        } catch (error) {
          stats.handlerErrors += 1;
          this.internalError(error);
          await pause(wait, keepAlive);
        }
      }
      stats.handled += 1;
      handled.set(action.action_id, true);
      if (handled.size > 10_000) handled.delete(handled.keys().next().value as string);
    };
    const started = source.start(handle, { groupId: `loopwarden-actions.${agent}` });
    started.catch((error: unknown) => this.internalError(error));
    return {
      ready: started,
      stats: () => ({ ...stats }),
      close: async () => {
        closed = true;
        await started.catch(() => undefined);
        await source.close();
      },
    };
  }

  stats(): LoopwardenStats {
    return { ...this.publisher.stats(), internalErrors: this.internalErrors };
  }

  /** Wait until queued events are delivered (or `timeoutMs`); true when all were. */
  flush(timeoutMs?: number): Promise<boolean> {
    return this.publisher.flush(timeoutMs);
  }

  /** Flush, then close the sink. Call on shutdown. */
  close(timeoutMs?: number): Promise<LoopwardenStats> {
    return this.publisher.close(timeoutMs).then((stats) => ({ ...stats, internalErrors: this.internalErrors }));
  }
}

/** Create the client. */
export function createLoopwarden(options: LoopwardenOptions): Loopwarden {
  return new Loopwarden(options);
}

/** State shared by the segments of one run. */
class RunState {
  started: boolean;
  nextSegment: number;
  pendingApprovalId: string | null;
  readonly resolved = new Set<string>();
  /** the policy this handle published in run_started; null: not known here (another handle did) */
  private runPolicy: Policy | null = null;
  /** the first segment number was given or continued, not assumed to be 0 */
  private readonly numbered: boolean;

  constructor(
    readonly lw: Loopwarden,
    readonly runId: string,
    readonly agent: string,
    readonly options: RunOptions & PolicyOptions,
  ) {
    const known = options.segment === undefined ? lw.nextSegmentOf(runId) : undefined;
    const first = options.segment ?? known?.next ?? 0;
    this.runPolicy = known?.policy ?? null;
    if (!Number.isSafeInteger(first) || first < 0) throw new LoopwardenConfigError(`segment must be an integer >= 0, got ${first}`);
    this.nextSegment = first;
    this.numbered = options.segment !== undefined || known !== undefined;
    this.started = !(options.publishRunStarted ?? first === 0);
    this.pendingApprovalId = options.pendingApprovalId ?? null;
  }

  /**
   * Start a segment: run_started (first time), approval_resolved for the answers carried, and
   * segment_started when the segment's policy is not the run's (or the run's is not known here).
   */
  begin(policy: Policy, described: DescribedPolicy, messages: unknown): SegmentTracker {
    const responses = approvalResponsesIn(messages);
    if (!this.numbered && this.nextSegment === 0 && responses.length > 0) {
      // A resume (the messages answer an approval) on a handle that would number it segment 0:
      // loopwarden would ignore every event of it as a duplicate of the run's first segment.
      throw new LoopwardenResumeError(
        `run ${JSON.stringify(this.runId)}: this call resumes approval ${JSON.stringify(responses[0]!.approvalId)} ` +
          `(its messages carry a tool-approval-response) on a new run handle that starts at segment 0; ` +
          `resume through the run's own handle, or pass { segment: <the original handle's nextSegment> } to run()`,
      );
    }
    if (!this.started) {
      this.started = true;
      const action = this.options.recovers;
      this.runPolicy = attemptPolicy(policy, action);
      this.lw.emit({
        type: 'run_started',
        run_id: this.runId,
        ts: this.lw.clock(),
        agent: this.agent,
        policy: this.runPolicy,
        ...(action ? { job_id: action.job_id, attempt: action.next_attempt as number, recovers: action.run_id } : {}),
      });
    }
    for (const { approvalId, approved } of responses) {
      if (this.resolved.has(approvalId)) continue;
      if (this.pendingApprovalId !== null && approvalId !== this.pendingApprovalId) continue;
      this.resolved.add(approvalId);
      this.lw.approvalResolved(this.runId, approvalId, approved);
    }
    this.pendingApprovalId = null;
    const segment = this.nextSegment;
    this.nextSegment += 1;
    this.lw.rememberSegment(this.runId, this.nextSegment, this.runPolicy);
    if (this.runPolicy === null || !samePolicy(policy, this.runPolicy)) {
      // docs/contract.md section 11: e.g. a generateText resume without stopWhen runs under one step
      this.lw.emit({ type: 'segment_started', run_id: this.runId, ts: this.lw.clock(), segment, policy });
    }
    return new SegmentTracker(this, segment, described, policy);
  }

  approvalRouted(approvalId: string, routing: ApprovalRouting): boolean {
    return this.lw.approvalRouted(this.runId, approvalId, routing);
  }

  approvalResolved(approvalId: string, approved: boolean): boolean {
    this.resolved.add(approvalId);
    if (this.pendingApprovalId === approvalId) this.pendingApprovalId = null;
    return this.lw.approvalResolved(this.runId, approvalId, approved);
  }
}

/** The segment whose agent call is running (for the agent copy's prepareCall, see instrument()). */
const CURRENT_SEGMENT = new AsyncLocalStorage<SegmentTracker>();

function samePolicy(a: Policy, b: Policy): boolean {
  return encodePolicy(a) === encodePolicy(b);
}

function encodePolicy(policy: Policy): string {
  return encodeEvent({ type: 'segment_started', run_id: '-', ts: 0, segment: 0, policy });
}

/** One `generate()`/`stream()` call. */
class SegmentTracker {
  readonly steps: StepSummary[] = [];
  private evaluatedLength = -1;
  private readonly evaluatedFired = new Set<string>();
  private ended = false;
  /** the call passed `experimental_steering` */
  private steering = false;
  /** the first error part of the stream (a provider failure the call did not reject for) */
  private streamError: unknown = undefined;

  /** a streaming call: reads of its consumer streams waiting now (undefined: not a stream) */
  private reads: number | undefined;
  /** tools running now (onToolExecutionStart/End), by tool call id */
  private readonly running = new Set<string>();
  private lastSignTs: number;
  private readonly startedTs: number;
  private activeTimer: ReturnType<typeof setInterval> | undefined;

  constructor(
    readonly run: RunState,
    readonly segment: number,
    public described: DescribedPolicy,
    policy: Policy,
  ) {
    this.startedTs = this.lastSignTs = run.lw.clock();
    // docs/contract.md section 11: a model call or tool longer than a third of the inactivity timeout is
    // told as run_active, so loopwarden does not call it STUCK; checked twice per third.
    const thirdMs = ((policy.inactivity_timeout_s ?? 300) * 1000) / 3;
    const maxMs = (run.lw.options.runActiveMaxS ?? 3600) * 1000;
    this.activeTimer = setInterval(() => this.guard(() => this.active(thirdMs, maxMs)), Math.max(10, thirdMs / 2));
    this.activeTimer.unref?.(); // never what keeps a process alive
  }

  private active(thirdMs: number, maxMs: number): void {
    if (this.ended) return;
    // A stream only moves while its consumer reads: one that nobody is reading (not yet, or any
    // more) is not active, whatever the timer says, and may go STUCK.
    if (this.reads !== undefined && this.reads === 0) return;
    const now = this.run.lw.clock();
    if (now - this.startedTs > maxMs && now - this.lastSignTs > maxMs) return; // hung: let it go STUCK
    if (now - this.lastSignTs < thirdMs) return;
    const [tool] = this.running;
    this.lastSignTs = now;
    this.run.lw.emit({
      type: 'run_active',
      run_id: this.run.runId,
      ts: now,
      segment: this.segment,
      in: tool === undefined ? 'model' : 'tool',
      tool_call_id: tool === undefined ? null : clipId(tool),
    });
  }

  private guard(fn: () => void): void {
    try {
      fn();
    } catch (error) {
      this.run.lw.internalError(error);
    }
  }

  onStep(step: unknown): void {
    this.guard(() => {
      if (this.ended) return;
      const summary = summarizeStep(step, this.steps.length);
      this.steps.push(summary);
      this.lastSignTs = this.run.lw.clock();
      this.run.lw.emit({
        type: 'step_finished',
        run_id: this.run.runId,
        ts: this.run.lw.clock(),
        segment: this.segment,
        step: summary.step,
        finish_reason: summary.finish_reason,
        tool_calls: summary.tool_calls,
        usage: summary.usage,
      });
    });
  }

  /** The call's own stopWhen, each condition wrapped to record its result; undefined = leave as is. */
  wrappedStopWhen(): AnyStopCondition[] | undefined {
    if (this.described.entries === null) return undefined;
    return this.described.entries.map(({ condition, description }) => {
      const wrapped: AnyStopCondition = (options) => {
        const result = condition(options);
        const note = (value: unknown) =>
          this.guard(() => {
            const steps = (options as { steps: ArrayLike<unknown> }).steps;
            if (steps.length !== this.evaluatedLength) {
              this.evaluatedLength = steps.length;
              this.evaluatedFired.clear();
            }
            if (value) for (const id of firedIds(description, steps)) this.evaluatedFired.add(id);
          });
        if (result != null && typeof (result as PromiseLike<boolean>).then === 'function') {
          return Promise.resolve(result).then((value) => {
            note(value);
            return value;
          });
        }
        note(result);
        return result;
      };
      return wrapped;
    });
  }

  private noteStreamError(error: unknown): void {
    if (this.streamError === undefined) this.streamError = error ?? new Error('stream error');
  }

  /**
   * The agent's prepareCall ran with `args` (our wrapped stopWhen among them) and returned
   * `prepared`. When it swapped stopWhen, the segment runs under that policy: describe it, tell
   * loopwarden (segment_started, before the first step), and wrap the new conditions so their
   * evaluation is observed as the agent's own are. Returns what the SDK should use.
   */
  prepared(args: Record<string, unknown>, prepared: unknown): unknown {
    try {
      if (prepared == null || typeof prepared !== 'object') return prepared;
      const out = prepared as Record<string, unknown>;
      if (out.stopWhen === args.stopWhen) return prepared;
      const toolNames = Object.keys((out.tools ?? args.tools ?? {}) as object);
      // generateText's own default when prepareCall dropped stopWhen
      const described = describeStopWhen(out.stopWhen ?? textDefaultStopWhen(), toolNames, 'prepareCall stopWhen');
      this.described = described;
      this.evaluatedLength = -1;
      this.evaluatedFired.clear();
      const policy = this.run.lw.policyFor(described, this.run.options);
      this.run.lw.emit({ type: 'segment_started', run_id: this.run.runId, ts: this.run.lw.clock(), segment: this.segment, policy });
      return { ...out, stopWhen: this.wrappedStopWhen() };
    } catch (error) {
      this.run.lw.internalError(error);
      return prepared;
    }
  }

  /** Whether stopWhen was evaluated after the last step, and the ids that were true then. */
  private lastEvaluation(): { evaluatedAtLast: boolean; fired: string[] } {
    if (this.described.entries === null) {
      // The SDK's default cap ran unwrapped (so its warning still logs): infer the evaluation
      // from the SDK's rule; the cap fires exactly at the 20th step.
      const evaluatedAtLast = sdkEvaluatesAfter(this.steps[this.steps.length - 1]);
      const fired = evaluatedAtLast && defaultCapFires(this.steps);
      return { evaluatedAtLast, fired: fired ? [`step_count:${DEFAULT_AGENT_STEP_CAP}`] : [] };
    }
    if (this.steps.length === 0 || this.evaluatedLength !== this.steps.length) return { evaluatedAtLast: false, fired: [] };
    return { evaluatedAtLast: true, fired: [...this.evaluatedFired].sort() };
  }

  end(outcome: CallOutcome): void {
    this.guard(() => {
      if (this.ended) return;
      this.ended = true;
      clearInterval(this.activeTimer);
      this.activeTimer = undefined;
      const evaluation =
        outcome.kind === 'resolved' ? this.lastEvaluation() : { evaluatedAtLast: false, fired: [] as string[] };
      const fired = evaluation.fired;
      const verdict = deriveBoundaryCause(outcome, this.steps, evaluation);
      let approval = null;
      if (verdict.approvalRequest) {
        const request = verdict.approvalRequest;
        const router = this.run.options.routeApproval ?? this.run.lw.options.routeApproval;
        let routing: ApprovalRouting | null | undefined;
        try {
          routing = router?.({ runId: this.run.runId, agent: this.run.agent, segment: this.segment, ...request });
        } catch (error) {
          this.run.lw.internalError(error);
        }
        approval = approvalOf(request, routing);
        this.run.pendingApprovalId = request.approvalId;
      }
      // Steering (ai >= 7.0.154): the SDK evaluates stopWhen after a step without tool calls only
      // when a steering message is waiting; our wrapped conditions saw that evaluation happen.
      const last = this.steps[this.steps.length - 1];
      const steered = this.steering && evaluation.evaluatedAtLast && last !== undefined && last.tool_calls.length === 0;
      this.run.lw.emit({
        type: 'run_ended',
        run_id: this.run.runId,
        ts: this.run.lw.clock(),
        segment: this.segment,
        cause: verdict.cause,
        fired: verdict.cause === 'stop_condition' || verdict.cause === 'tool_error' ? fired.slice(0, LIMITS.firedItems) : [],
        step_count: this.steps.length,
        approval,
        error_name: verdict.errorName,
        ...(steered ? { steered: true } : {}),
      });
    });
  }

  /** Call parameters with our callbacks and conditions; the caller's own are called too. */
  callParams<P extends object>(params: P, opts: { hookEnd: boolean }): P {
    const original = params as Record<string, unknown>;
    this.steering = original.experimental_steering != null;
    const { onStepFinish, onStepEnd, ...rest } = original;
    const userStep = (onStepEnd ?? onStepFinish) as Callback;
    const out: Record<string, unknown> = {
      ...rest,
      onStepEnd: (event: unknown) => {
        this.onStep(event);
        return userStep?.(event);
      },
    };
    const stopWhen = this.wrappedStopWhen();
    if (stopWhen !== undefined) out.stopWhen = stopWhen;
    // Which tools run now, for run_active's `in`/`tool_call_id`.
    const { onToolExecutionStart, onToolExecutionEnd } = original;
    out.onToolExecutionStart = (event: unknown) => {
      const id = (event as { toolCall?: { toolCallId?: unknown } } | null)?.toolCall?.toolCallId;
      if (typeof id === 'string') this.running.add(id);
      return (onToolExecutionStart as Callback)?.(event);
    };
    out.onToolExecutionEnd = (event: unknown) => {
      const id = (event as { toolCall?: { toolCallId?: unknown } } | null)?.toolCall?.toolCallId;
      if (typeof id === 'string') this.running.delete(id);
      return (onToolExecutionEnd as Callback)?.(event);
    };
    if (opts.hookEnd) {
      const { onFinish, onEnd } = original;
      const userEnd = (onEnd ?? onFinish) as Callback;
      delete out.onFinish;
      out.onEnd = (event: unknown) => {
        this.end(this.streamError === undefined ? { kind: 'resolved' } : { kind: 'resolved', streamError: this.streamError });
        return userEnd?.(event);
      };
      // A provider failure in a stream does not reject anything: the SDK puts an `error` part in
      // the stream (also when doStream throws at a later step) and ends normally. onChunk sees
      // every part, including those (errors a stream retry handles are not shown to it);
      // onStepError sees a step that failed before producing a result.
      const userChunk = original.onChunk as Callback;
      out.onChunk = (event: unknown) => {
        const chunk = (event as { chunk?: { type?: unknown; error?: unknown } } | null)?.chunk;
        if (chunk?.type === 'error') this.noteStreamError(chunk.error);
        return userChunk?.(event);
      };
      const userStepError = original.onStepError as Callback;
      out.onStepError = (event: unknown) => {
        this.noteStreamError((event as { error?: unknown } | null)?.error);
        return userStepError?.(event);
      };
    }
    return out as P;
  }

  /** Follow a streaming result: its steps promise rejects on abort, timeout and error. */
  watchStream(result: unknown, abortSignal: AbortSignal | undefined): void {
    this.guard(() => {
      // `result.steps` would start consuming the stream: see sdk-internals.ts (item 5).
      const delayed = streamStepsPromise(result);
      if (delayed) {
        delayed.then(
          () => undefined,
          (error: unknown) => this.end({ kind: 'rejected', error, signalAborted: abortSignal?.aborted === true }),
        );
      }
    });
  }

  /**
   * The streaming result as the caller sees it: the same object, except that the streams its
   * public getters hand out report a consumer that stops reading (cancels, e.g. `break` out of a
   * `for await`, or an HTTP client that went away under `toUIMessageStreamResponse`) as the end
   * of the run: cause `aborted`, error_name `StreamCancelled` (or the cancel reason's name).
   * Without this, a run nobody reads any more just stops, and loopwarden would call it STUCK.
   */
  watchConsumer<R>(result: R): R {
    if (result == null || typeof result !== 'object') return result;
    this.reads = 0;
    const reading = (delta: number) => {
      this.reads = (this.reads ?? 0) + delta;
    };
    try {
      const onCancel = (reason: unknown) =>
        this.end({
          kind: 'rejected',
          error:
            reason instanceof Error
              ? reason
              : Object.assign(new Error('the stream consumer stopped reading'), { name: 'StreamCancelled' }),
          signalAborted: true,
        });
      return new Proxy(result as object, {
        get(target, prop, receiver) {
          const value = Reflect.get(target, prop, receiver);
          return typeof prop === 'string' && CONSUMER_STREAMS.has(prop) ? reportingCancel(value, onCancel, reading) : value;
        },
      }) as R;
    } catch (error) {
      this.run.lw.internalError(error);
      return result;
    }
  }

  /** Wrap a generate-style promise. Same value, same error; run_ended on the way. */
  follow<T>(promise: PromiseLike<T>, abortSignal: AbortSignal | undefined): Promise<T> {
    return Promise.resolve(promise).then(
      (value) => {
        this.end({ kind: 'resolved' });
        return value;
      },
      (error: unknown) => {
        this.end({ kind: 'rejected', error, signalAborted: abortSignal?.aborted === true });
        throw error;
      },
    );
  }
}

// The getters of a streaming result that hand a stream to its consumer. The response helpers
// (toUIMessageStream, toTextStreamResponse …) and textStream read `stream` themselves, so they are
// covered through it (a stream wrapped twice reports once: the run ends once).
const CONSUMER_STREAMS = new Set([
  'stream', 'fullStream', 'textStream', 'partialOutputStream', 'experimental_partialOutputStream', 'elementStream',
]);

/**
 * `stream` as is, except that cancelling it calls `onCancel` first and `reading` counts the reads
 * waiting (+1 / -1). Not a stream: returned as is.
 */
function reportingCancel(stream: unknown, onCancel: (reason: unknown) => void, reading: (delta: number) => void): unknown {
  if (!(stream instanceof ReadableStream)) return stream;
  const reader = stream.getReader();
  return new ReadableStream(
    {
      async pull(controller) {
        reading(1);
        try {
          const { done, value } = await reader.read();
          if (done) controller.close();
          else controller.enqueue(value);
        } catch (error) {
          controller.error(error);
        } finally {
          reading(-1);
        }
      },
      cancel(reason) {
        try {
          onCancel(reason);
        } finally {
          return reader.cancel(reason);
        }
      },
    },
    { highWaterMark: 0 },
  );
}

/** A ToolLoopAgent with loopwarden attached; `run(runId)` gives the per-run handle. */
export class WatchedAgent<AGENT extends ToolLoopAgent<any, any, any, any>> {
  constructor(
    private readonly lw: Loopwarden,
    readonly agent: AGENT,
    readonly name: string,
    private readonly described: DescribedPolicy,
    /** The policy published in run_started. */
    readonly policy: Policy,
    private readonly options: PolicyOptions,
    /** what the calls go through: the agent, or its copy that reports prepareCall's stopWhen */
    private readonly runner: AGENT = agent,
  ) {}

  /** The handle for one application-level run; each generate()/stream() on it is a segment. */
  run(runId: string, options: RunOptions = {}): AgentRun<AGENT> {
    checkRunId(runId);
    checkRecovers(runId, options.recovers);
    const state = new RunState(this.lw, runId, this.name, { ...this.options, ...options });
    return new AgentRun(this.lw, state, this.runner, this.described, this.policy);
  }
}

function abortSignalOf(params: unknown): AbortSignal | undefined {
  const signal = (params as { abortSignal?: unknown } | null)?.abortSignal;
  return signal instanceof AbortSignal ? signal : undefined;
}

/**
 * The call's params with the tracker's hooks, or the caller's own params when there is no
 * tracker or hooking fails: instrumentation never throws into the agent.
 */
function hooked<P extends object>(lw: Loopwarden, tracker: SegmentTracker | undefined, params: P, hookEnd: boolean): P {
  if (!tracker) return params;
  try {
    return tracker.callParams(params, { hookEnd });
  } catch (error) {
    lw.internalError(error);
    return params;
  }
}

/** What every run handle offers besides its calls: the run id, segments, approvals. */
abstract class RunHandle {
  protected constructor(protected readonly state: RunState) {}

  get runId(): string {
    return this.state.runId;
  }

  /** The segment number the next call will get. */
  get nextSegment(): number {
    return this.state.nextSegment;
  }

  approvalRouted(approvalId: string, routing: ApprovalRouting): boolean {
    return this.state.approvalRouted(approvalId, routing);
  }

  approvalResolved(approvalId: string, approved: boolean): boolean {
    return this.state.approvalResolved(approvalId, approved);
  }
}

/** Run handle for a ToolLoopAgent: `generate` and `stream` take the agent's own parameters. */
export class AgentRun<AGENT extends ToolLoopAgent<any, any, any, any>> extends RunHandle {
  /** Same parameters and result as `agent.generate`. */
  readonly generate: AGENT['generate'];
  /** Same parameters and result as `agent.stream`. The run ends when the stream is consumed. */
  readonly stream: AGENT['stream'];

  constructor(
    private readonly lw: Loopwarden,
    state: RunState,
    agent: AGENT,
    described: DescribedPolicy,
    policy: Policy,
  ) {
    super(state);
    const begin = (params: unknown): SegmentTracker | undefined => {
      try {
        return state.begin(policy, described, (params as { messages?: unknown } | null)?.messages);
      } catch (error) {
        if (error instanceof LoopwardenResumeError) throw error; // a usage error: told at once
        lw.internalError(error);
        return undefined;
      }
    };
    this.generate = ((params: Parameters<AGENT['generate']>[0]) => {
      let tracker: SegmentTracker | undefined;
      try {
        tracker = begin(params);
      } catch (error) {
        return Promise.reject(error);
      }
      const callParams = hooked(lw, tracker, params, false);
      const promise = tracker ? CURRENT_SEGMENT.run(tracker, () => agent.generate(callParams)) : agent.generate(callParams);
      return tracker ? tracker.follow(promise, abortSignalOf(params)) : promise;
    }) as AGENT['generate'];
    this.stream = ((params: Parameters<AGENT['stream']>[0]) => {
      let tracker: SegmentTracker | undefined;
      try {
        tracker = begin(params);
      } catch (error) {
        return Promise.reject(error);
      }
      const callParams = hooked(lw, tracker, params, true);
      const promise = tracker ? CURRENT_SEGMENT.run(tracker, () => agent.stream(callParams)) : agent.stream(callParams);
      if (!tracker) return promise;
      return Promise.resolve(promise).then(
        (result) => {
          tracker.watchStream(result, abortSignalOf(params));
          return tracker.watchConsumer(result);
        },
        (error: unknown) => {
          tracker.end({ kind: 'rejected', error, signalAborted: abortSignalOf(params)?.aborted === true });
          throw error;
        },
      );
    }) as AGENT['stream'];
  }

}

/**
 * Run handle for direct `generateText`/`streamText` calls. The policy is read from the first
 * call's `stopWhen` (generateText's default is `isStepCount(1)`, published as such).
 */
export class TextRun extends RunHandle {
  /** Same signature and result as the SDK's `generateText`. */
  readonly generateText: typeof generateText;
  /** Same signature and result as the SDK's `streamText`. The run ends when the stream is consumed. */
  readonly streamText: typeof streamText;

  constructor(
    private readonly lw: Loopwarden,
    runId: string,
    agent: string,
    private readonly options: PolicyOptions & RunOptions,
  ) {
    super(new RunState(lw, runId, agent, options));
    const begin = (params: Record<string, unknown>): SegmentTracker | undefined => {
      try {
        const toolNames = Object.keys((params.tools ?? {}) as object);
        // generateText/streamText stop after one step unless told otherwise.
        const stopWhen = params.stopWhen ?? textDefaultStopWhen();
        const described = describeStopWhen(stopWhen, toolNames, 'stopWhen');
        return this.state.begin(lw.policyFor(described, this.options), described, params.messages);
      } catch (error) {
        if (error instanceof LoopwardenResumeError) throw error; // a usage error: told at once
        lw.internalError(error);
        return undefined;
      }
    };
    this.generateText = ((params: Record<string, unknown>) => {
      let tracker: SegmentTracker | undefined;
      try {
        tracker = begin(params);
      } catch (error) {
        return Promise.reject(error);
      }
      const callParams = hooked(lw, tracker, params, false);
      const promise = generateText(callParams as never);
      return tracker ? tracker.follow(promise, abortSignalOf(params)) : promise;
    }) as typeof generateText;
    this.streamText = ((params: Record<string, unknown>) => {
      const tracker = begin(params);
      const callParams = hooked(lw, tracker, params, true);
      try {
        if (tracker && callParams !== params) {
          const userAbort = params.onAbort as Callback;
          callParams.onAbort = (event: unknown) => {
            tracker.end({
              kind: 'rejected',
              error: (event as { reason?: unknown } | null)?.reason ?? new DOMException('aborted', 'AbortError'),
              signalAborted: true,
            });
            return userAbort?.(event);
          };
        }
      } catch (error) {
        lw.internalError(error);
      }
      const result = streamText(callParams as never);
      tracker?.watchStream(result, abortSignalOf(params));
      return tracker ? tracker.watchConsumer(result) : result;
    }) as typeof streamText;
  }

}
