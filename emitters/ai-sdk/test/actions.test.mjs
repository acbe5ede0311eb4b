// Recovery actions (docs/contract.md section 12): onAction hands each action over once it is due, drops
// repeats by action_id, retries a handler that throws, and run(newRunId, { recovers }) starts the next
// attempt linked to its job — with a real ToolLoopAgent on the mock model, in memory.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { ToolLoopAgent } from 'ai';
import {
  createLoopwarden,
  decodeEvent,
  decodeRecoveryAction,
  encodeEvent,
  isStepCount,
  LoopwardenConfigError,
  LoopwardenDecodeError,
  MemoryActionSource,
  MemorySink,
} from '../dist/index.js';
import { modelStep, scriptedModel } from './e2e/scenarios.mjs';
import { schemaValidator } from './helpers/schema.mjs';

globalThis.AI_SDK_LOG_WARNINGS = false;

const BOUNDED = { max_attempts: 3, on: { STUCK: 'resume' }, backoff_s: 0, escalate_to: 'oncall' };

function action(fields = {}) {
  return {
    type: 'recovery_action',
    action_id: 'inv-7:4',
    run_id: 'inv-7',
    agent: 'invoices',
    job_id: 'inv-7',
    attempt: 1,
    next_attempt: 2,
    action: 'resume',
    reason: 'STUCK:inactivity_timeout',
    ts: Date.now(),
    not_before_ts: Date.now(),
    next_policy: null,
    escalate_to: 'oncall',
    decided_by: 'policy:v1',
    ...fields,
  };
}

function client(extra = {}) {
  const sink = new MemorySink();
  const actions = new MemoryActionSource();
  const errors = [];
  const lw = createLoopwarden({ sink, actions, agent: 'invoices', onInternalError: (e) => errors.push(e), ...extra });
  return { sink, actions, lw, errors };
}

test('onAction hands each action to the handler once, dropping a repeat of its action_id', async () => {
  const { actions, lw } = client();
  const seen = [];
  const sub = lw.onAction((a) => seen.push(a.action_id));
  await sub.ready;
  await actions.push(action(), action(), action({ action_id: 'inv-8:2', run_id: 'inv-8', job_id: 'inv-8' }));
  assert.deepEqual(seen, ['inv-7:4', 'inv-8:2']);
  assert.deepEqual(sub.stats(), { handled: 2, repeats: 1, invalid: 0, skipped: 0, handlerErrors: 0 });
  assert.equal(actions.consumed.length, 3, 'the repeat is consumed too: nothing comes again');
  await sub.close();
});

test('an action is handed over no earlier than its not_before_ts', async () => {
  const { actions, lw } = client();
  const due = Date.now() + 400;
  let at;
  const sub = lw.onAction(() => {
    at = Date.now();
  });
  await actions.push(action({ not_before_ts: due }));
  assert.ok(at >= due, `handled ${due - at} ms early`);
  await sub.close();
});

test('a handler that throws is called again with the same action, and the record is consumed only after it returned', async () => {
  const { actions, lw, errors } = client();
  let calls = 0;
  const sub = lw.onAction(() => {
    calls += 1;
    if (calls < 3) throw new Error('controller busy');
  }, { retryFirstMs: 10, retryMaxMs: 20 });
  await actions.push(action());
  assert.equal(calls, 3);
  assert.equal(sub.stats().handlerErrors, 2);
  assert.equal(errors.length, 2);
  assert.equal(actions.consumed.length, 1);
  await sub.close();
});

test('closing while an action waits for its due time leaves its record unconsumed (it comes again)', async () => {
  const { actions, lw } = client();
  const seen = [];
  const sub = lw.onAction((a) => seen.push(a.action_id));
  const pushed = actions.push(action({ not_before_ts: Date.now() + 60_000 }));
  await new Promise((r) => setTimeout(r, 50));
  await sub.close();
  await pushed;
  assert.deepEqual(seen, []);
  assert.deepEqual(actions.consumed, []);
});

test('a record that is not a recovery action is counted, told, skipped; accept leaves out other jobs', async () => {
  const { actions, lw, errors } = client();
  const seen = [];
  const sub = lw.onAction((a) => seen.push(a.job_id), { accept: (a) => a.job_id.startsWith('inv-') });
  await actions.push('{"type":"recovery_action"}', action({ action_id: 'crm-1:3', run_id: 'crm-1', job_id: 'crm-1' }), action());
  assert.deepEqual(seen, ['inv-7']);
  assert.deepEqual(sub.stats(), { handled: 1, repeats: 0, invalid: 1, skipped: 1, handlerErrors: 0 });
  assert.ok(errors[0] instanceof LoopwardenDecodeError && /action_id/.test(errors[0].message));
  await sub.close();
});

test("onAction takes only its own agent's actions by default, another agent's with options.agent", async () => {
  const { actions, lw } = client();
  const ours = [];
  const sub = lw.onAction((a) => ours.push(a.action_id));
  const crm = action({ action_id: 'crm-1:3', run_id: 'crm-1', job_id: 'crm-1', agent: 'crm' });
  const unnamed = action({ action_id: 'x-1:op:q1', run_id: 'x-1', job_id: 'x-1', agent: null });
  await actions.push(crm, unnamed, action());
  assert.deepEqual(ours, ['inv-7:4']);
  assert.deepEqual(sub.stats(), { handled: 1, repeats: 0, invalid: 0, skipped: 2, handlerErrors: 0 });
  await sub.close();
  const other = client();
  const theirs = [];
  const sub2 = lw.onAction((a) => theirs.push(a.action_id), { agent: 'crm', source: other.actions });
  await other.actions.push(crm, action());
  assert.deepEqual(theirs, ['crm-1:3']);
  await sub2.close();
});

test('onAction with no agent named anywhere is a configuration error that says where to name it', () => {
  const lw = createLoopwarden({ sink: new MemorySink(), actions: new MemoryActionSource() });
  assert.throws(() => lw.onAction(() => undefined), (e) => e instanceof LoopwardenConfigError && /onAction\(handler, \{ agent \}\)/.test(e.message));
});

test('an action without its agent field is invalid: counted, told, skipped', async () => {
  const { actions, lw, errors } = client();
  const sub = lw.onAction(() => undefined);
  const { agent, ...unnamed } = action();
  await actions.push(JSON.stringify(unnamed));
  assert.equal(sub.stats().invalid, 1);
  assert.ok(errors[0] instanceof LoopwardenDecodeError && /agent/.test(errors[0].message));
  await sub.close();
});

test('onAction without an action source is a configuration error that says how to give one', () => {
  const lw = createLoopwarden({ sink: new MemorySink() });
  assert.throws(() => lw.onAction(() => undefined), (e) => e instanceof LoopwardenConfigError && /KafkaActionSource/.test(e.message));
});

test('run(newRunId, { recovers }) starts the next attempt: job, attempt, recovers and next_policy in run_started', async () => {
  const { sink, actions, lw } = client({ recovery: BOUNDED });
  const tighter = { version: 'v1-tight', stop_when: [{ kind: 'step_count', count: 4 }], inactivity_timeout_s: 60 };
  const starts = [];
  const sub = lw.onAction(async (a) => {
    if (a.next_attempt === null) return;
    const run = lw.run(`${a.job_id}-a${a.next_attempt}`, { recovers: a });
    starts.push(run.runId);
    await run.generateText({ model: scriptedModel([modelStep({ text: 'done' })]), prompt: 'invoice 7', stopWhen: isStepCount(4) });
  });
  await actions.push(action({ next_policy: tighter }));
  await sub.close();
  await lw.flush();
  assert.deepEqual(starts, ['inv-7-a2']);
  const [started] = sink.events().filter((e) => e.type === 'run_started');
  assert.deepEqual(
    { job_id: started.job_id, attempt: started.attempt, recovers: started.recovers },
    { job_id: 'inv-7', attempt: 2, recovers: 'inv-7' },
  );
  assert.deepEqual(started.policy, { ...tighter, recovery: BOUNDED }, "next_policy, keeping the job's bound");
  assert.equal(schemaValidator()(JSON.parse(encodeEvent(started))), null);
  assert.deepEqual(decodeEvent(encodeEvent(started)), started);
});

test('a recovered ToolLoopAgent run without next_policy publishes its own policy, recovery included', async () => {
  const lw = createLoopwarden({ sink: new MemorySink(), agent: 'invoices' });
  const sink = lw.options.sink;
  const agent = new ToolLoopAgent({ model: scriptedModel([modelStep({ text: 'ok' })]), stopWhen: isStepCount(5) });
  const watched = lw.instrument(agent, { recovery: BOUNDED });
  await watched.run('inv-7-a2', { recovers: action() }).generate({ prompt: 'invoice 7' });
  await lw.flush();
  const events = sink.events();
  const [started] = events.filter((e) => e.type === 'run_started');
  assert.equal(started.attempt, 2);
  assert.deepEqual(started.policy.recovery, BOUNDED);
  assert.deepEqual(started.policy.stop_when, [{ kind: 'step_count', count: 5 }]);
  assert.equal(events.filter((e) => e.type === 'segment_started').length, 0, 'the segment runs under the run policy');
});

test('recovers refuses an action that starts nothing and a run id of an earlier attempt', () => {
  const lw = createLoopwarden({ sink: new MemorySink() });
  assert.throws(
    () => lw.run('inv-7-a2', { recovers: action({ action: 'escalate', next_attempt: null, reason: 'attempts_exhausted' }) }),
    (e) => e instanceof LoopwardenConfigError && /"inv-7:4" is "escalate": it starts no attempt/.test(e.message),
  );
  assert.throws(
    () => lw.run('inv-7', { recovers: action() }),
    (e) => e instanceof LoopwardenConfigError && /names an earlier attempt of job "inv-7"/.test(e.message),
  );
});

test('a recovery policy with an unknown field or a wrong action is refused at set-up, naming it', () => {
  const sink = new MemorySink();
  assert.throws(
    () => createLoopwarden({ sink, recovery: { max_attempt: 3 } }),
    (e) => e instanceof LoopwardenConfigError && /recovery\.max_attempt is invalid: Unknown field/.test(e.message),
  );
  assert.throws(
    () => createLoopwarden({ sink, recovery: { on: { STUCK: 'retry' } } }),
    (e) => e instanceof LoopwardenConfigError && /recovery\.on\.STUCK is invalid/.test(e.message),
  );
  assert.throws(
    () => createLoopwarden({ sink, recovery: { on: { UNCERTAIN: 'restart' } } }),
    (e) => e instanceof LoopwardenConfigError && /recovery\.on\.UNCERTAIN is invalid: Expected an action that answers UNCERTAIN/.test(e.message),
  );
});

test('decodeRecoveryAction reads the Python codec\'s recovery_action and names a bad field', () => {
  const wire = JSON.stringify(action({ next_policy: { version: 'v2', recovery: { max_attempts: 2 } } }));
  assert.equal(decodeRecoveryAction(wire).next_policy.recovery.max_attempts, 2);
  assert.throws(() => decodeRecoveryAction(JSON.stringify(action({ action: 'explode' }))), /at `\$\.action`/);
});
