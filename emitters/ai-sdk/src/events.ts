/**
 * Wire types of loopwarden (docs/contract.md sections 3 and 6), their canonical JSON encoding and a
 * validating decoder.
 *
 * Field names are the wire names (snake_case) so that a value of these types *is* the event.
 * Optional properties are the fields the spec gives a default for (or that may be absent): the
 * encoder writes them only when set, so both "set" and "unset" survive a round trip. The emitter
 * itself always fills every field it knows.
 */

export const FINISH_REASONS = [
  'stop',
  'length',
  'content-filter',
  'tool-calls',
  'error',
  'interrupted',
  'other',
] as const;
export type FinishReason = (typeof FINISH_REASONS)[number];

export const TOOL_CALL_STATUSES = [
  'result',
  'error',
  'pending',
  'approval_requested',
  'denied',
  'cancelled',
] as const;
export type ToolCallStatus = (typeof TOOL_CALL_STATUSES)[number];

export const CAUSES = [
  'natural_finish',
  'stop_condition',
  'unexecuted_tool',
  'approval_required',
  'tool_error',
  'aborted',
  'timeout',
  'error',
  'unknown',
] as const;
export type Cause = (typeof CAUSES)[number];

export const CONDITION_ROLES = ['bound', 'completion'] as const;
export type ConditionRole = (typeof CONDITION_ROLES)[number];

export const RECEIPT_KINDS = ['file', 'record', 'message', 'deployment', 'analysis', 'other'] as const;
export type ReceiptKind = (typeof RECEIPT_KINDS)[number];

export const VERIFIERS = ['destination', 'validator', 'human'] as const;
export type Verifier = (typeof VERIFIERS)[number];

export const HEALTH_STATES = [
  'RUNNING',
  'WAITING',
  'WAITING_UNROUTED',
  'STUCK',
  'BOUNDED_STOP',
  'FAILED',
  'VERIFYING',
  'VERIFIED_COMPLETE',
  'FALSE_COMPLETE',
  'UNCERTAIN',
] as const;
export type HealthState = (typeof HEALTH_STATES)[number];

/** Reasons a health transition can carry (loopwarden.codecs.vocabulary; tests/unit/test_vocabulary.py checks them). */
export const HEALTH_REASONS = [
  'started',
  'progress',
  'approval_routed',
  'approval_resolved',
  'receipt',
  'negative_receipt',
  'late_receipt',
  'unclassified',
  'no_progress',
  'approval_expired',
  'receipt_window_expired',
  'natural_finish',
  'stop_condition',
  'unexecuted_tool',
  'approval_required',
  'tool_error',
  'aborted',
  'timeout',
  'error',
  'cause_mismatch',
  'fired_mismatch',
  'step_count_mismatch',
  'policy_overrun',
  'policy_unknown',
  'step_gap',
  'cause_not_recorded',
  'tool_error_unseen',
  'producer_dropped',
] as const;
export type HealthReason = (typeof HEALTH_REASONS)[number];

/** Why a verdict is UNCERTAIN (evidence.disagreements). */
export const DISAGREEMENTS = [
  'cause_mismatch',
  'fired_mismatch',
  'step_count_mismatch',
  'policy_overrun',
  'policy_unknown',
  'step_gap',
  'cause_not_recorded',
  'tool_error_unseen',
  'producer_dropped',
] as const;
export type Disagreement = (typeof DISAGREEMENTS)[number];

/** Valid events that changed no state (evidence.ignored's keys). */
export const IGNORED_EVENTS = [
  'duplicate_step',
  'step_after_end',
  'duplicate_run_ended',
  'duplicate_run_started',
  'unmatched_approval',
  'duplicate_receipt',
  'untracked_step',
  'duplicate_expectation',
  'late_segment_started',
  'stale_receipt',
  'refused_operator_action',
] as const;
export type IgnoredEvent = (typeof IGNORED_EVENTS)[number];

export type Condition =
  | { kind: 'step_count'; count: number }
  | { kind: 'tool_call'; tools: string[] }
  | { kind: 'loop_finished' }
  | { kind: 'token_budget'; max_tokens: number }
  | { kind: 'custom'; name: string; role: ConditionRole };

export interface Policy {
  version: string;
  /** null (or absent) = the ToolLoopAgent default, `[step_count 20]`. */
  stop_when?: Condition[] | null;
  inactivity_timeout_s?: number;
  receipt_window_s?: number;
  required_outcomes?: string[];
  /** docs/contract.md section 12: what the job may do on its own after this attempt (absent: the agent's default). */
  recovery?: RecoveryPolicy;
}

/** Actions a recovery policy may call for (docs/contract.md section 12). */
export const RECOVERY_ACTION_NAMES = ['resume', 'restart', 'reverify', 'escalate'] as const;
export type RecoveryActionName = (typeof RECOVERY_ACTION_NAMES)[number];
/** Every action on `agent.actions`: a person's `abandon` and `acknowledge` are records, nothing to start. */
export const ACTION_NAMES = [...RECOVERY_ACTION_NAMES, 'abandon', 'acknowledge'] as const;
export type ActionName = (typeof ACTION_NAMES)[number];

/** Which states each action can answer (loopwarden refuses a policy that asks otherwise). */
export const ACTION_STATES: Readonly<Record<RecoveryActionName, readonly HealthState[]>> = {
  resume: ['STUCK'],
  restart: ['STUCK', 'BOUNDED_STOP', 'FALSE_COMPLETE', 'FAILED'],
  reverify: ['FALSE_COMPLETE'],
  escalate: ['WAITING', 'WAITING_UNROUTED', 'STUCK', 'BOUNDED_STOP', 'FAILED', 'FALSE_COMPLETE', 'UNCERTAIN'],
};

/** Declared, never inferred; loopwarden refuses unknown fields (a misspelt bound must not go unnoticed). */
export interface RecoveryPolicy {
  /** attempts of the job, the first included (1–10000, default 1) */
  max_attempts?: number;
  /** which action a state calls for; a state absent: no automatic action */
  on?: Partial<Record<HealthState, RecoveryActionName>>;
  /** the action is due this long after the transition (seconds, default 0) */
  backoff_s?: number;
  /** the next attempt's stop policy; null: the same */
  next_policy?: Policy | null;
  /** tools whose repetition is safe: FAILED restarts only over these */
  idempotent_tools?: string[];
  /** who is told when the policy cannot act */
  escalate_to?: string | null;
}

/** One action on `agent.actions` (keyed by job_id): what the fleet should do, and when. Never produced by the emitter. */
export interface RecoveryAction {
  type: 'recovery_action';
  /** `<run_id>:<seq>` of the transition that caused it (`<run_id>:op:<request_id>` for a person's): drop repeats by it */
  action_id: string;
  /** the attempt that ended */
  run_id: string;
  /** the run's agent; null only for a person's action on a run whose run_started never arrived */
  agent: string | null;
  job_id: string;
  attempt: number;
  /** the attempt to start, for resume and restart; null otherwise */
  next_attempt: number | null;
  action: ActionName;
  reason: string;
  ts: number;
  /** ms since the epoch: when it is due */
  not_before_ts: number;
  /** the next attempt's stop policy; null: the same */
  next_policy: Policy | null;
  escalate_to: string | null;
  /** `policy:<version>` or `person:<key id>[/<actor>]` */
  decided_by: string;
  /** a person restarted beyond max_attempts */
  override_bound?: boolean;
}

export interface ToolCallRecord {
  id: string;
  name: string;
  status: ToolCallStatus;
  /** The provider ran it (default false); the SDK still counts it in hasToolCall. */
  provider_executed?: boolean;
}

export interface Usage {
  input_tokens?: number | null;
  output_tokens?: number | null;
  total_tokens?: number | null;
}

export interface Approval {
  approval_id: string;
  tool_call_id: string;
  tool_name: string;
  owner: string | null;
  deadline_ts: number | null;
  resume_token: string | null;
}

export interface RunStarted {
  type: 'run_started';
  run_id: string;
  ts: number;
  agent: string;
  policy: Policy;
  /** docs/contract.md section 12: the job this run is an attempt of (absent: its own job's first attempt) */
  job_id?: string;
  attempt?: number;
  /** the run id of the attempt this one replaces */
  recovers?: string;
}

export interface StepFinished {
  type: 'step_finished';
  run_id: string;
  ts: number;
  segment?: number;
  step: number;
  finish_reason: FinishReason;
  tool_calls?: ToolCallRecord[];
  usage?: Usage;
}

export interface RunEnded {
  type: 'run_ended';
  run_id: string;
  ts: number;
  segment?: number;
  cause: Cause;
  fired?: string[];
  step_count: number;
  /** required (may be null); set when cause is approval_required */
  approval: Approval | null;
  error_name: string | null;
  /**
   * Beyond docs/contract.md: the call ran with `experimental_steering` and a steering message was waiting
   * when its last step ended, so the SDK evaluated stopWhen after that step although it had no
   * tool calls (ai >= 7.0.154). Omitted (false) otherwise.
   */
  steered?: boolean;
}

export interface ApprovalRouted {
  type: 'approval_routed';
  run_id: string;
  ts: number;
  approval_id: string;
  owner: string | null;
  deadline_ts: number | null;
  resume_token: string | null;
}

export interface ApprovalResolved {
  type: 'approval_resolved';
  run_id: string;
  ts: number;
  approval_id: string;
  approved: boolean;
}

/** docs/contract.md section 11: the policy of a segment that does not run under the run's. */
export interface SegmentStarted {
  type: 'segment_started';
  run_id: string;
  ts: number;
  segment: number;
  /** null: the run's policy */
  policy: Policy | null;
}

/** docs/contract.md section 11: a model call or tool is still going (activity, nothing else). */
export interface RunActive {
  type: 'run_active';
  run_id: string;
  ts: number;
  segment: number;
  in: 'model' | 'tool';
  tool_call_id?: string | null;
}

/** docs/contract.md section 11: the producer lost `count` events of this run. */
export interface EventsDropped {
  type: 'events_dropped';
  run_id: string;
  ts: number;
  count: number;
}

export type EvidenceValue = string | number | boolean;

export interface OutcomeReceipt {
  type: 'outcome_receipt';
  run_id: string;
  ts: number;
  receipt_id: string;
  kind: ReceiptKind;
  verifier: Verifier;
  verified: boolean;
  evidence?: Record<string, EvidenceValue>;
  /** The `ts` of the `run_started` of the run occurrence this receipt answers (signed when present). */
  run_started_ts?: number;
}

/** Output of loopwarden on `agent.health`; typed here for consumers, never produced by the emitter. */
export interface HealthTransition {
  type: 'health_transition';
  run_id: string;
  seq: number;
  ts: number;
  emitted_ts: number;
  agent: string | null;
  policy_version: string | null;
  from_state: HealthState | null;
  to_state: HealthState;
  /** One of HEALTH_REASONS (a newer loopwarden may add more: not narrowed, so old consumers keep decoding). */
  reason: string;
  evidence: Record<string, unknown>;
}

/** Events on `agent.steps`. */
export type StepsEvent =
  | RunStarted
  | StepFinished
  | RunEnded
  | ApprovalRouted
  | ApprovalResolved
  | SegmentStarted
  | RunActive
  | EventsDropped;
/** Every event type of the wire contract. */
export type LoopwardenEvent = StepsEvent | OutcomeReceipt | HealthTransition;
export type EventType = LoopwardenEvent['type'];

export const EVENT_TYPES: readonly EventType[] = [
  'run_started',
  'step_finished',
  'run_ended',
  'approval_routed',
  'approval_resolved',
  'segment_started',
  'run_active',
  'events_dropped',
  'outcome_receipt',
  'health_transition',
];

/**
 * Size limits of the wire contract (those of `schema/loopwarden.schema.json`). The emitter keeps
 * within them; the decoder enforces them.
 */
export const LIMITS = {
  runId: 200,
  agent: 100,
  policyVersion: 200,
  id: 200,
  resumeToken: 1000,
  errorName: 200,
  firedId: 300,
  firedItems: 200,
  stopWhenItems: 100,
  toolCallTools: 100,
  toolCalls: 1000,
  maxSeconds: 31_622_400,
  evidenceKeys: 64,
  evidenceKey: 100,
  evidenceString: 1000,
} as const;

/** Condition id as used in `fired` and evidence: `step_count:20`, `tool_call:done`, ... */
export function conditionIds(condition: Condition): string[] {
  switch (condition.kind) {
    case 'step_count':
      return [`step_count:${condition.count}`];
    case 'tool_call':
      return condition.tools.map((tool) => `tool_call:${tool}`);
    case 'loop_finished':
      return [];
    case 'token_budget':
      return [`token_budget:${condition.max_tokens}`];
    case 'custom':
      return [`custom:${condition.name}`];
  }
}

// ---------------------------------------------------------------------------------------------
// Encoding: canonical key order (the order of the spec tables), optional fields only when set.

type Obj = Record<string, unknown>;

function pick(source: Obj, keys: readonly string[]): Obj {
  const out: Obj = {};
  for (const key of keys) {
    if (source[key] !== undefined) out[key] = source[key];
  }
  return out;
}

const KEYS = {
  run_started: ['type', 'run_id', 'ts', 'agent', 'policy', 'job_id', 'attempt', 'recovers'],
  step_finished: ['type', 'run_id', 'ts', 'segment', 'step', 'finish_reason', 'tool_calls', 'usage'],
  run_ended: ['type', 'run_id', 'ts', 'segment', 'cause', 'fired', 'step_count', 'approval', 'error_name', 'steered'],
  approval_routed: ['type', 'run_id', 'ts', 'approval_id', 'owner', 'deadline_ts', 'resume_token'],
  approval_resolved: ['type', 'run_id', 'ts', 'approval_id', 'approved'],
  segment_started: ['type', 'run_id', 'ts', 'segment', 'policy'],
  run_active: ['type', 'run_id', 'ts', 'segment', 'in', 'tool_call_id'],
  events_dropped: ['type', 'run_id', 'ts', 'count'],
  outcome_receipt: ['type', 'run_id', 'ts', 'receipt_id', 'kind', 'verifier', 'verified', 'evidence', 'run_started_ts'],
  health_transition: [
    'type',
    'run_id',
    'seq',
    'ts',
    'emitted_ts',
    'agent',
    'policy_version',
    'from_state',
    'to_state',
    'reason',
    'evidence',
  ],
} as const satisfies Record<EventType, readonly string[]>;

const POLICY_KEYS = ['version', 'stop_when', 'inactivity_timeout_s', 'receipt_window_s', 'required_outcomes', 'recovery'];
const RECOVERY_KEYS = ['max_attempts', 'on', 'backoff_s', 'next_policy', 'idempotent_tools', 'escalate_to'];
const CONDITION_KEYS: Record<Condition['kind'], readonly string[]> = {
  step_count: ['kind', 'count'],
  tool_call: ['kind', 'tools'],
  loop_finished: ['kind'],
  token_budget: ['kind', 'max_tokens'],
  custom: ['kind', 'name', 'role'],
};
const TOOL_CALL_KEYS = ['id', 'name', 'status', 'provider_executed'];
const USAGE_KEYS = ['input_tokens', 'output_tokens', 'total_tokens'];
const APPROVAL_KEYS = ['approval_id', 'tool_call_id', 'tool_name', 'owner', 'deadline_ts', 'resume_token'];

function canonicalCondition(condition: Condition): Obj {
  return pick(condition as unknown as Obj, CONDITION_KEYS[condition.kind] ?? ['kind']);
}

function canonicalPolicy(policy: Policy): Obj {
  const out = pick(policy as unknown as Obj, POLICY_KEYS);
  if (Array.isArray(policy.stop_when)) out.stop_when = policy.stop_when.map(canonicalCondition);
  if (policy.recovery !== undefined) {
    const recovery = pick(policy.recovery as unknown as Obj, RECOVERY_KEYS);
    if (policy.recovery.next_policy) recovery.next_policy = canonicalPolicy(policy.recovery.next_policy);
    out.recovery = recovery;
  }
  return out;
}

/** The event as a plain object with canonical key order (what `encodeEvent` serialises). */
export function canonicalEvent(event: LoopwardenEvent): Obj {
  const out = pick(event as unknown as Obj, KEYS[event.type]);
  switch (event.type) {
    case 'run_started':
      out.policy = canonicalPolicy(event.policy);
      break;
    case 'step_finished':
      if (event.tool_calls !== undefined) out.tool_calls = event.tool_calls.map((c) => pick(c as unknown as Obj, TOOL_CALL_KEYS));
      if (event.usage !== undefined) out.usage = pick(event.usage as Obj, USAGE_KEYS);
      break;
    case 'run_ended':
      if (event.approval) out.approval = pick(event.approval as unknown as Obj, APPROVAL_KEYS);
      break;
    case 'segment_started':
      if (event.policy) out.policy = canonicalPolicy(event.policy);
      break;
    default:
      break;
  }
  return out;
}

/** One event as one line of JSON (UTF-8 when written), without a trailing newline. */
export function encodeEvent(event: LoopwardenEvent): string {
  return JSON.stringify(canonicalEvent(event));
}

// ---------------------------------------------------------------------------------------------
// Decoding: strict on the fields the spec defines, unknown fields ignored.

/** Raised for input that is not a valid loopwarden event; `path` names the bad field. */
export class LoopwardenDecodeError extends Error {
  readonly path: string;
  constructor(message: string, path: string) {
    super(`${message} - at \`${path}\``);
    this.name = 'LoopwardenDecodeError';
    this.path = path;
  }
}

const isObj = (v: unknown): v is Obj => typeof v === 'object' && v !== null && !Array.isArray(v);

class Reader {
  constructor(
    private readonly obj: Obj,
    private readonly path: string,
  ) {}

  private fail(key: string, what: string): never {
    throw new LoopwardenDecodeError(`Expected ${what}`, `${this.path}.${key}`);
  }

  /** The object read (a fresh copy, for free-form fields such as evidence). */
  entries(): [string, unknown][] {
    return Object.entries(this.obj);
  }

  has(key: string): boolean {
    return this.obj[key] !== undefined;
  }

  raw(key: string): unknown {
    return this.obj[key];
  }

  str(key: string, opts: { min?: number; max?: number } = {}): string {
    const v = this.obj[key];
    if (v === undefined) this.fail(key, 'a required field');
    if (typeof v !== 'string') this.fail(key, '`str`');
    const len = [...v].length;
    if (opts.min !== undefined && len < opts.min) this.fail(key, `\`str\` of length >= ${opts.min}`);
    if (opts.max !== undefined && len > opts.max) this.fail(key, `\`str\` of length <= ${opts.max}`);
    return v;
  }

  int(key: string, opts: { min?: number } = {}): number {
    const v = this.obj[key];
    if (v === undefined) this.fail(key, 'a required field');
    if (typeof v !== 'number' || !Number.isSafeInteger(v)) this.fail(key, '`int`');
    if (opts.min !== undefined && v < opts.min) this.fail(key, `\`int\` >= ${opts.min}`);
    return v;
  }

  bool(key: string): boolean {
    const v = this.obj[key];
    if (v === undefined) this.fail(key, 'a required field');
    if (typeof v !== 'boolean') this.fail(key, '`bool`');
    return v;
  }

  oneOf<T extends string>(key: string, values: readonly T[]): T {
    const v = this.str(key);
    if (!(values as readonly string[]).includes(v)) this.fail(key, `one of ${values.join(', ')}`);
    return v as T;
  }

  nullableStr(key: string, opts: { min?: number; max?: number } = {}): string | null {
    return this.obj[key] === null ? null : this.str(key, opts);
  }

  seconds(key: string): number {
    const v = this.obj[key];
    if (typeof v !== 'number' || !Number.isFinite(v)) this.fail(key, '`float`');
    if (!(v > 0 && v <= LIMITS.maxSeconds)) this.fail(key, `\`float\` > 0 and <= ${LIMITS.maxSeconds}`);
    return v;
  }

  at(key: string): string {
    return `${this.path}.${key}`;
  }

  nullableInt(key: string, opts: { min?: number } = {}): number | null {
    return this.obj[key] === null ? null : this.int(key, opts);
  }

  array(key: string): unknown[] {
    const v = this.obj[key];
    if (v === undefined) this.fail(key, 'a required field');
    if (!Array.isArray(v)) this.fail(key, '`array`');
    return v;
  }

  object(key: string): Reader {
    const v = this.obj[key];
    if (v === undefined) this.fail(key, 'a required field');
    if (!isObj(v)) this.fail(key, '`object`');
    return new Reader(v, `${this.path}.${key}`);
  }

  strList(
    key: string,
    opts: { minItems?: number; maxItems?: number; item?: { min?: number; max?: number } } = {},
  ): string[] {
    const items = this.sized(key, opts.minItems, opts.maxItems);
    return items.map((item, i) => {
      const path = `${this.path}.${key}[${i}]`;
      if (typeof item !== 'string') throw new LoopwardenDecodeError('Expected `str`', path);
      const length = [...item].length;
      if (opts.item?.min !== undefined && length < opts.item.min) {
        throw new LoopwardenDecodeError(`Expected \`str\` of length >= ${opts.item.min}`, path);
      }
      if (opts.item?.max !== undefined && length > opts.item.max) {
        throw new LoopwardenDecodeError(`Expected \`str\` of length <= ${opts.item.max}`, path);
      }
      return item;
    });
  }

  private sized(key: string, minItems?: number, maxItems?: number): unknown[] {
    const items = this.array(key);
    if (minItems !== undefined && items.length < minItems) this.fail(key, `an array of length >= ${minItems}`);
    if (maxItems !== undefined && items.length > maxItems) this.fail(key, `an array of length <= ${maxItems}`);
    return items;
  }

  items(key: string, maxItems?: number): Reader[] {
    return this.sized(key, undefined, maxItems).map((item, i) => {
      if (!isObj(item)) throw new LoopwardenDecodeError('Expected `object`', `${this.path}.${key}[${i}]`);
      return new Reader(item, `${this.path}.${key}[${i}]`);
    });
  }
}

const L = LIMITS;
const ID = { min: 1, max: L.id };

function decodeCondition(r: Reader): Condition {
  const kind = r.oneOf('kind', ['step_count', 'tool_call', 'loop_finished', 'token_budget', 'custom'] as const);
  switch (kind) {
    case 'step_count':
      return { kind, count: r.int('count', { min: 0 }) };
    case 'tool_call':
      return { kind, tools: r.strList('tools', { minItems: 1, maxItems: L.toolCallTools, item: ID }) };
    case 'loop_finished':
      return { kind };
    case 'token_budget':
      return { kind, max_tokens: r.int('max_tokens', { min: 1 }) };
    case 'custom':
      return { kind, name: r.str('name', ID), role: r.oneOf('role', CONDITION_ROLES) };
  }
}

function decodePolicy(r: Reader): Policy {
  const policy: Policy = { version: r.str('version', { max: L.policyVersion }) };
  if (r.has('stop_when')) {
    policy.stop_when = r.raw('stop_when') === null ? null : r.items('stop_when', L.stopWhenItems).map(decodeCondition);
  }
  if (r.has('inactivity_timeout_s')) policy.inactivity_timeout_s = r.seconds('inactivity_timeout_s');
  if (r.has('receipt_window_s')) policy.receipt_window_s = r.seconds('receipt_window_s');
  if (r.has('required_outcomes')) {
    policy.required_outcomes = r.strList('required_outcomes', { maxItems: RECEIPT_KINDS.length }).map((kind, i) => {
      if (!(RECEIPT_KINDS as readonly string[]).includes(kind)) {
        throw new LoopwardenDecodeError(`Expected one of ${RECEIPT_KINDS.join(', ')}`, `${r.at('required_outcomes')}[${i}]`);
      }
      return kind;
    });
  }
  if (r.has('recovery')) policy.recovery = decodeRecoveryPolicy(r.object('recovery'));
  return policy;
}



function decodeRecoveryPolicy(r: Reader): RecoveryPolicy {
  for (const [key] of r.entries()) {
    if (!RECOVERY_KEYS.includes(key)) throw new LoopwardenDecodeError(`Unknown field ${JSON.stringify(key)}`, r.at(key));
  }
  const recovery: RecoveryPolicy = {};
  if (r.has('max_attempts')) {
    recovery.max_attempts = r.int('max_attempts', { min: 1 });
    if (recovery.max_attempts > 10_000) throw new LoopwardenDecodeError('Expected `int` <= 10000', r.at('max_attempts'));
  }
  if (r.has('on')) {
    const on: Partial<Record<HealthState, RecoveryActionName>> = {};
    for (const [state, action] of r.object('on').entries()) {
      const path = `${r.at('on')}.${state}`;
      if (!(HEALTH_STATES as readonly string[]).includes(state)) throw new LoopwardenDecodeError('Expected a state', path);
      if (!(RECOVERY_ACTION_NAMES as readonly unknown[]).includes(action)) {
        throw new LoopwardenDecodeError(`Expected one of ${RECOVERY_ACTION_NAMES.join(', ')}`, path);
      }
      const answers = ACTION_STATES[action as RecoveryActionName];
      if (!answers.includes(state as HealthState)) {
        throw new LoopwardenDecodeError(`Expected an action that answers ${state} (${action} answers ${answers.join(', ')})`, path);
      }
      on[state as HealthState] = action as RecoveryActionName;
    }
    recovery.on = on;
  }
  if (r.has('backoff_s')) {
    const v = r.raw('backoff_s');
    if (typeof v !== 'number' || !(v >= 0 && v <= LIMITS.maxSeconds)) {
      throw new LoopwardenDecodeError(`Expected \`float\` >= 0 and <= ${LIMITS.maxSeconds}`, r.at('backoff_s'));
    }
    recovery.backoff_s = v;
  }
  if (r.has('next_policy')) recovery.next_policy = r.raw('next_policy') === null ? null : decodePolicy(r.object('next_policy'));
  if (r.has('idempotent_tools')) recovery.idempotent_tools = r.strList('idempotent_tools', { maxItems: 1000, item: ID });
  if (r.has('escalate_to')) recovery.escalate_to = r.nullableStr('escalate_to', ID);
  return recovery;
}

/** A Reader over a JSON text or an already parsed value, which must be an object. */
function readerOf(input: string | unknown): Reader {
  let value: unknown = input;
  if (typeof input === 'string') {
    try {
      value = JSON.parse(input);
    } catch (exc) {
      throw new LoopwardenDecodeError(`Invalid JSON: ${(exc as Error).message}`, '$');
    }
  }
  if (!isObj(value)) throw new LoopwardenDecodeError('Expected `object`', '$');
  return new Reader(value, '$');
}

/**
 * Decode and validate one `recovery_action` read from `agent.actions` (a JSON text or a parsed value).
 * Unknown fields are dropped. Raises LoopwardenDecodeError naming the offending path.
 */
export function decodeRecoveryAction(input: string | unknown): RecoveryAction {
  const r = readerOf(input);
  r.oneOf('type', ['recovery_action'] as const);
  const action: RecoveryAction = {
    type: 'recovery_action',
    action_id: r.str('action_id', { min: 1 }),
    run_id: r.str('run_id', { min: 1, max: L.runId }),
    agent: r.nullableStr('agent'),
    job_id: r.str('job_id', { min: 1, max: L.runId }),
    attempt: r.int('attempt', { min: 1 }),
    next_attempt: r.nullableInt('next_attempt', { min: 2 }),
    action: r.oneOf('action', ACTION_NAMES),
    reason: r.str('reason'),
    ts: r.int('ts', { min: 0 }),
    not_before_ts: r.int('not_before_ts', { min: 0 }),
    next_policy: r.raw('next_policy') === null ? null : decodePolicy(r.object('next_policy')),
    escalate_to: r.nullableStr('escalate_to'),
    decided_by: r.str('decided_by'),
  };
  if (r.has('override_bound')) action.override_bound = r.bool('override_bound');
  return action;
}

function decodeUsage(r: Reader): Usage {
  const usage: Usage = {};
  for (const key of USAGE_KEYS as (keyof Usage)[]) {
    if (r.has(key)) usage[key] = r.nullableInt(key, { min: 0 });
  }
  return usage;
}

function decodeApproval(r: Reader): Approval {
  return {
    approval_id: r.str('approval_id', ID),
    tool_call_id: r.str('tool_call_id', ID),
    tool_name: r.str('tool_name', ID),
    owner: r.has('owner') ? r.nullableStr('owner', ID) : null,
    deadline_ts: r.has('deadline_ts') ? r.nullableInt('deadline_ts', { min: 0 }) : null,
    resume_token: r.has('resume_token') ? r.nullableStr('resume_token', { min: 1, max: L.resumeToken }) : null,
  };
}

function decodeEvidence(r: Reader, key: string): Record<string, EvidenceValue> {
  const entries = r.object(key).entries();
  if (entries.length > L.evidenceKeys) throw new LoopwardenDecodeError(`Expected at most ${L.evidenceKeys} keys`, r.at(key));
  const out: Record<string, EvidenceValue> = {};
  for (const [k, v] of entries) {
    const path = `${r.at(key)}.${k}`;
    if (k.length > L.evidenceKey) throw new LoopwardenDecodeError(`Expected a key of length <= ${L.evidenceKey}`, path);
    if (typeof v === 'string' && v.length > L.evidenceString) {
      throw new LoopwardenDecodeError(`Expected \`str\` of length <= ${L.evidenceString}`, path);
    }
    if (typeof v !== 'string' && typeof v !== 'boolean' && !(typeof v === 'number' && Number.isFinite(v))) {
      throw new LoopwardenDecodeError('Expected `str | int | float | bool`', path);
    }
    out[k] = v;
  }
  return out;
}

/**
 * Decode and validate one event (a JSON text or an already parsed value).
 *
 * Unknown fields are dropped; fields with defaults stay absent when absent, so
 * `encodeEvent(decodeEvent(x))` is `x` up to key order and number formatting.
 * Raises LoopwardenDecodeError naming the offending path.
 */
export function decodeEvent(input: string | unknown): LoopwardenEvent {
  const r = readerOf(input);
  const type = r.oneOf('type', EVENT_TYPES);
  if (type === 'health_transition') return decodeHealthTransition(r);
  const run_id = r.str('run_id', { min: 1, max: L.runId });
  const ts = r.int('ts', { min: 0 });
  switch (type) {
    case 'run_started': {
      const event: RunStarted = { type, run_id, ts, agent: r.str('agent', { min: 1, max: L.agent }), policy: decodePolicy(r.object('policy')) };
      if (r.has('job_id')) event.job_id = r.str('job_id', { min: 1, max: L.runId });
      if (r.has('attempt')) event.attempt = r.int('attempt', { min: 1 });
      if (r.has('recovers')) event.recovers = r.str('recovers', { min: 1, max: L.runId });
      return event;
    }
    case 'step_finished': {
      const event: StepFinished = {
        type,
        run_id,
        ts,
        step: r.int('step', { min: 0 }),
        finish_reason: r.oneOf('finish_reason', FINISH_REASONS),
      };
      if (r.has('segment')) event.segment = r.int('segment', { min: 0 });
      if (r.has('tool_calls')) {
        event.tool_calls = r.items('tool_calls', L.toolCalls).map((c) => {
          const call: ToolCallRecord = {
            id: c.str('id', ID),
            name: c.str('name', ID),
            status: c.oneOf('status', TOOL_CALL_STATUSES),
          };
          if (c.has('provider_executed')) call.provider_executed = c.bool('provider_executed');
          return call;
        });
      }
      if (r.has('usage')) event.usage = decodeUsage(r.object('usage'));
      return canonicalEvent(event) as unknown as StepFinished;
    }
    case 'run_ended': {
      const cause = r.oneOf('cause', CAUSES);
      const event: RunEnded = {
        type,
        run_id,
        ts,
        cause,
        step_count: r.int('step_count', { min: 0 }),
        approval: r.raw('approval') === null ? null : decodeApproval(r.object('approval')),
        error_name: r.nullableStr('error_name', { max: L.errorName }),
      };
      if (r.has('segment')) event.segment = r.int('segment', { min: 0 });
      if (r.has('fired')) event.fired = r.strList('fired', { maxItems: L.firedItems, item: { max: L.firedId } });
      if (r.has('steered')) event.steered = r.bool('steered');
      if (cause === 'approval_required' && event.approval === null) {
        throw new LoopwardenDecodeError('Expected an approval when cause is approval_required', '$.approval');
      }
      return canonicalEvent(event) as unknown as RunEnded;
    }
    case 'approval_routed':
      return {
        type,
        run_id,
        ts,
        approval_id: r.str('approval_id', ID),
        owner: r.nullableStr('owner', ID),
        deadline_ts: r.nullableInt('deadline_ts', { min: 0 }),
        resume_token: r.nullableStr('resume_token', { min: 1, max: L.resumeToken }),
      };
    case 'approval_resolved':
      return { type, run_id, ts, approval_id: r.str('approval_id', ID), approved: r.bool('approved') };
    case 'segment_started':
      return {
        type,
        run_id,
        ts,
        segment: r.int('segment', { min: 0 }),
        policy: r.raw('policy') === null ? null : decodePolicy(r.object('policy')),
      };
    case 'run_active': {
      const event: RunActive = { type, run_id, ts, segment: r.int('segment', { min: 0 }), in: r.oneOf('in', ['model', 'tool'] as const) };
      if (r.has('tool_call_id')) event.tool_call_id = r.nullableStr('tool_call_id', ID);
      return event;
    }
    case 'events_dropped':
      return { type, run_id, ts, count: r.int('count', { min: 1 }) };
    case 'outcome_receipt': {
      const event: OutcomeReceipt = {
        type,
        run_id,
        ts,
        receipt_id: r.str('receipt_id', ID),
        kind: r.oneOf('kind', RECEIPT_KINDS),
        verifier: r.oneOf('verifier', VERIFIERS),
        verified: r.bool('verified'),
      };
      if (r.has('evidence')) event.evidence = decodeEvidence(r, 'evidence');
      if (r.has('run_started_ts')) event.run_started_ts = r.int('run_started_ts', { min: 0 });
      return event;
    }
  }
}

function decodeHealthTransition(r: Reader): HealthTransition {
  return {
    type: 'health_transition',
    run_id: r.str('run_id'),
    seq: r.int('seq', { min: 1 }),
    ts: r.int('ts'),
    emitted_ts: r.int('emitted_ts'),
    agent: r.nullableStr('agent'),
    policy_version: r.nullableStr('policy_version'),
    from_state: r.raw('from_state') === null ? null : r.oneOf('from_state', HEALTH_STATES),
    to_state: r.oneOf('to_state', HEALTH_STATES),
    reason: r.str('reason'),
    // Free-form here: loopwarden's output, passed through as is.
    evidence: Object.fromEntries(r.object('evidence').entries()),
  };
}
