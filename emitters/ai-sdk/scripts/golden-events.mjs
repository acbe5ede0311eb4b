// The events of test/vectors/ts-golden.jsonl: every event type, every optional field set and
// unset, every enum value. Encoded by the package's own encoder (scripts/gen-vectors.mjs);
// loopwarden's Python tests decode the file, and test/vectors.test.mjs checks it is up to date.
import {
  encodeEvent,
  CAUSES,
  FINISH_REASONS,
  RECEIPT_KINDS,
  TOOL_CALL_STATUSES,
  VERIFIERS,
} from '../dist/index.js';

const T0 = 1_780_000_000_000;

export function goldenEvents() {
  const events = [];
  let ts = T0;
  const at = () => ts++;

  // run_started: policy with only the required field; explicit null stop_when; empty list;
  // every condition kind and every knob set.
  events.push({ type: 'run_started', run_id: 'ts-p0', ts: at(), agent: 'a', policy: { version: 'v0' } });
  events.push({
    type: 'run_started',
    run_id: 'ts-p1',
    ts: at(),
    agent: 'invoice-agent',
    policy: { version: 'v1', stop_when: null, inactivity_timeout_s: 300, receipt_window_s: 600, required_outcomes: [] },
  });
  events.push({ type: 'run_started', run_id: 'ts-p2', ts: at(), agent: 'invoice-agent', policy: { version: '', stop_when: [] } });
  events.push({
    type: 'run_started',
    run_id: 'ts-p3',
    ts: at(),
    agent: 'invoice-agent',
    policy: {
      version: 'v3',
      stop_when: [
        { kind: 'step_count', count: 20 },
        { kind: 'step_count', count: 0 },
        { kind: 'tool_call', tools: ['done', 'finish'] },
        { kind: 'loop_finished' },
        { kind: 'token_budget', max_tokens: 50000 },
        { kind: 'custom', name: 'stop-on-tool-error', role: 'bound' },
        { kind: 'custom', name: 'validated', role: 'completion' },
      ],
      inactivity_timeout_s: 30.5,
      receipt_window_s: 120,
      required_outcomes: ['file', 'record'],
    },
  });

  // step_finished: defaults unset; then every finish reason, every status, usage shapes.
  events.push({ type: 'step_finished', run_id: 'ts-s', ts: at(), step: 0, finish_reason: 'stop' });
  FINISH_REASONS.forEach((finish_reason, i) =>
    events.push({
      type: 'step_finished',
      run_id: 'ts-s',
      ts: at(),
      segment: 0,
      step: i + 1,
      finish_reason,
      tool_calls: [],
      usage: { input_tokens: null, output_tokens: null, total_tokens: null },
    }),
  );
  events.push({
    type: 'step_finished',
    run_id: 'ts-s',
    ts: at(),
    segment: 1,
    step: 0,
    finish_reason: 'tool-calls',
    tool_calls: [
      ...TOOL_CALL_STATUSES.map((status) => ({ id: `tc-${status}`, name: 'lookup', status })),
      { id: 'tc-provider', name: 'web_search', status: 'result', provider_executed: true },
      { id: 'tc-client', name: 'lookup', status: 'result', provider_executed: false },
    ],
    usage: { input_tokens: 100, output_tokens: 20, total_tokens: 120 },
  });
  events.push({ type: 'step_finished', run_id: 'ts-s', ts: at(), segment: 1, step: 1, finish_reason: 'length', usage: {} });
  events.push({
    type: 'step_finished',
    run_id: 'ts-s',
    ts: at(),
    segment: 1,
    step: 2,
    finish_reason: 'stop',
    usage: { input_tokens: 7 },
  });
  events.push({
    type: 'step_finished',
    run_id: 'ts-s',
    ts: at(),
    segment: 1,
    step: 3,
    finish_reason: 'stop',
    tool_calls: [],
    usage: { input_tokens: null, output_tokens: 0, total_tokens: 9 },
  });

  // run_ended: every cause; segment and fired set and unset; approvals routed and unrouted.
  const routed = {
    approval_id: 'ap-1',
    tool_call_id: 'tc-1',
    tool_name: 'pay_invoice',
    owner: 'finance-oncall',
    deadline_ts: T0 + 3_600_000,
    resume_token: 'tok-1',
  };
  const unrouted = { approval_id: 'ap-2', tool_call_id: 'tc-2', tool_name: 'pay_invoice', owner: null, deadline_ts: null, resume_token: null };
  events.push({ type: 'run_ended', run_id: 'ts-e', ts: at(), cause: 'natural_finish', step_count: 1, approval: null, error_name: null });
  CAUSES.forEach((cause, i) =>
    events.push({
      type: 'run_ended',
      run_id: `ts-e${i}`,
      ts: at(),
      segment: i % 3,
      cause,
      fired: cause === 'stop_condition' ? ['step_count:20', 'tool_call:done', 'token_budget:50000', 'custom:validated'] : [],
      step_count: i,
      approval: cause === 'approval_required' ? routed : null,
      error_name: cause === 'aborted' ? 'AbortError' : cause === 'timeout' ? 'TimeoutError' : cause === 'error' ? 'APICallError' : null,
    }),
  );
  events.push({ type: 'run_ended', run_id: 'ts-e-unrouted', ts: at(), segment: 2, cause: 'approval_required', fired: [], step_count: 1, approval: unrouted, error_name: null });
  // steered: stopWhen evaluated after a tool-less last step (experimental steering)
  events.push({ type: 'run_ended', run_id: 'ts-e-steered', ts: at(), cause: 'stop_condition', fired: ['step_count:1'], step_count: 1, approval: null, error_name: null, steered: true });

  // approval_routed / approval_resolved
  events.push({ type: 'approval_routed', run_id: 'ts-e-unrouted', ts: at(), approval_id: 'ap-2', owner: 'ops', deadline_ts: T0 + 99, resume_token: 'tok-2' });
  events.push({ type: 'approval_routed', run_id: 'ts-e-unrouted', ts: at(), approval_id: 'ap-2', owner: null, deadline_ts: null, resume_token: null });
  events.push({ type: 'approval_resolved', run_id: 'ts-e-unrouted', ts: at(), approval_id: 'ap-2', approved: true });
  events.push({ type: 'approval_resolved', run_id: 'ts-e-unrouted', ts: at(), approval_id: 'ap-2', approved: false });

  // spec.md section 11: segment_started (a policy, null), run_active (model, tool), events_dropped
  events.push({
    type: 'segment_started',
    run_id: 'ts-e-unrouted',
    ts: at(),
    segment: 3,
    policy: { version: 'v1-resume', stop_when: [{ kind: 'step_count', count: 1 }], inactivity_timeout_s: 300, receipt_window_s: 600, required_outcomes: [] },
  });
  events.push({ type: 'segment_started', run_id: 'ts-e-unrouted', ts: at(), segment: 4, policy: null });
  events.push({ type: 'run_active', run_id: 'ts-e-unrouted', ts: at(), segment: 3, in: 'model', tool_call_id: null });
  events.push({ type: 'run_active', run_id: 'ts-e-unrouted', ts: at(), segment: 3, in: 'tool', tool_call_id: 'tc-9' });
  events.push({ type: 'run_active', run_id: 'ts-e-unrouted', ts: at(), segment: 3, in: 'model' });
  events.push({ type: 'events_dropped', run_id: 'ts-e-unrouted', ts: at(), count: 17 });

  // outcome_receipt: every kind and verifier; evidence unset, empty, every value type.
  events.push({ type: 'outcome_receipt', run_id: 'ts-r', ts: at(), receipt_id: 'rc-unset', kind: 'file', verifier: 'destination', verified: true });
  RECEIPT_KINDS.forEach((kind, i) =>
    events.push({
      type: 'outcome_receipt',
      run_id: 'ts-r',
      ts: at(),
      receipt_id: `rc-${kind}`,
      kind,
      verifier: VERIFIERS[i % VERIFIERS.length],
      verified: i % 2 === 0,
      evidence: i === 0 ? { key: 'invoices/42.pdf', sha256: 'ab'.repeat(32), size: 1024, ratio: 0.5, ok: true } : {},
    }),
  );

  // health_transition (loopwarden's output; typed in the package for consumers)
  events.push({
    type: 'health_transition',
    run_id: 'ts-p1',
    seq: 1,
    ts: T0,
    emitted_ts: T0 + 1,
    agent: 'invoice-agent',
    policy_version: 'v1',
    from_state: null,
    to_state: 'RUNNING',
    reason: 'started',
    evidence: {
      reported_cause: null,
      derived_cause: null,
      fired: [],
      step_count: 0,
      segments: 0,
      tool_errors: 0,
      finish_reason: null,
      disagreements: [],
      receipt_ids: [],
      approval: null,
    },
  });
  events.push({
    type: 'health_transition',
    run_id: 'ts-e-unrouted',
    seq: 2,
    ts: T0 + 50,
    emitted_ts: T0 + 51,
    agent: null,
    policy_version: null,
    from_state: 'RUNNING',
    to_state: 'WAITING_UNROUTED',
    reason: 'approval_required',
    evidence: {
      reported_cause: 'approval_required',
      derived_cause: 'approval_required',
      fired: [],
      step_count: 1,
      segments: 3,
      tool_errors: 0,
      finish_reason: 'tool-calls',
      disagreements: [],
      receipt_ids: [],
      approval: unrouted,
    },
  });
  return events;
}

/** The file's exact content: one encoded event per line. */
export function goldenJsonl() {
  return goldenEvents().map((event) => `${encodeEvent(event)}\n`).join('');
}
