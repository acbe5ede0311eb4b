// Real ToolLoopAgents (MockLanguageModelV4, no network) instrumented with the in-memory sink:
// what is published, in which order, with which cause — and that the agent never notices.
import assert from 'node:assert/strict';
import { before, test } from 'node:test';
import { ToolLoopAgent, jsonSchema, tool } from 'ai';
import { MockLanguageModelV4 } from 'ai/test';
import {
  createLoopwarden,
  decodeEvent,
  hasToolCall,
  isStepCount,
  LoopwardenConfigError,
  MemorySink,
  namedCondition,
  tokenBudget,
} from '../dist/index.js';
import { LEAK_MARKER, modelStep, runScenarios, scriptedModel } from './e2e/scenarios.mjs';
import { drawCase } from './oracle/sdk-oracle.mjs';
import { schemaValidator } from './helpers/schema.mjs';

globalThis.AI_SDK_LOG_WARNINGS = false;

let sink;
let expected;
let byRun;

before(async () => {
  sink = new MemorySink();
  ({ expected } = await runScenarios({ sink, prefix: '' }));
  byRun = new Map();
  for (const event of sink.events()) {
    if (!byRun.has(event.run_id)) byRun.set(event.run_id, []);
    byRun.get(event.run_id).push(event);
  }
});

const ended = (run) => byRun.get(run).filter((e) => e.type === 'run_ended');

test('every published event validates against the JSON Schema and the TS decoder', () => {
  const validate = schemaValidator();
  assert.ok(sink.records.length > 50);
  for (const record of sink.records) {
    assert.equal(validate(JSON.parse(record.value)), null, record.value);
    assert.doesNotThrow(() => decodeEvent(record.value), record.value);
    assert.equal(record.key, JSON.parse(record.value).run_id, 'keyed by run id');
    assert.equal(record.topic, JSON.parse(record.value).type === 'outcome_receipt' ? 'agent.outcomes' : 'agent.steps');
  }
});

test('content-free: no prompt, text, tool input or output reaches the wire', () => {
  const forbidden = new Set(['text', 'input', 'output', 'content', 'messages', 'prompt', 'args', 'result', 'reasoning', 'error']);
  const walk = (value, path) => {
    if (Array.isArray(value)) value.forEach((v, i) => walk(v, `${path}[${i}]`));
    else if (value && typeof value === 'object') {
      for (const [k, v] of Object.entries(value)) {
        assert.ok(!forbidden.has(k), `${path}.${k} must not be published`);
        walk(v, `${path}.${k}`);
      }
    }
  };
  for (const record of sink.records) {
    assert.ok(!record.value.includes(LEAK_MARKER), `leaked content: ${record.value}`);
    assert.ok(!record.value.includes('upstream refused'), `leaked a tool error message: ${record.value}`);
    walk(JSON.parse(record.value), '$');
  }
});

test('each run: run_started first, contiguous steps per segment, one run_ended per segment with its step count', () => {
  for (const [run, events] of byRun) {
    const steps = events.filter((e) => e.type !== 'outcome_receipt');
    assert.equal(steps[0].type, 'run_started', run);
    assert.equal(steps.filter((e) => e.type === 'run_started').length, 1, run);
    const segments = new Map();
    for (const e of steps) {
      if (e.type === 'step_finished') {
        const seen = segments.get(e.segment) ?? [];
        assert.equal(e.step, seen.length, `${run}: step gap in segment ${e.segment}`);
        seen.push(e);
        segments.set(e.segment, seen);
      }
      if (e.type === 'run_ended') assert.equal(e.step_count, (segments.get(e.segment) ?? []).length, run);
    }
    const ends = ended(run);
    assert.deepEqual(ends.map((e) => e.segment), ends.map((_, i) => i), `${run}: segments 0..n`);
  }
});

test('causes, fired ids and error names per case of the research note', () => {
  const want = {
    'natural-verified': ['natural_finish', [], null],
    'natural-no-receipt': ['natural_finish', [], null],
    'done-without-execute-verified': ['unexecuted_tool', [], null],
    'done-with-execute-negative': ['stop_condition', ['tool_call:done'], null],
    'done-with-execute-receipt-first': ['stop_condition', ['tool_call:done'], null],
    'step-cap': ['stop_condition', ['step_count:3'], null],
    'default-step-cap': ['stop_condition', ['step_count:20'], null],
    'token-budget': ['stop_condition', ['token_budget:50'], null],
    'tool-error-stop': ['tool_error', ['custom:stop-on-tool-error'], null],
    'tool-error-recovered': ['natural_finish', [], null],
    'approval-routed': ['approval_required', [], null],
    'approval-unrouted': ['approval_required', [], null],
    'approval-routed-later': ['approval_required', [], null],
    abort: ['aborted', [], 'AbortError'],
    'timeout-total': ['timeout', [], 'TimeoutError'],
    'timeout-step': ['timeout', [], 'TimeoutError'],
    'stream-natural': ['natural_finish', [], null],
    'generate-text-done': ['stop_condition', ['tool_call:done'], null],
    // provider errors on every path, aborts and timeouts inside tools, provider tools,
    // a stream whose consumer stops reading
    'stream-provider-error': ['error', [], 'Error'],
    'agent-stream-provider-error': ['error', [], 'Error'],
    'stream-throws-later': ['error', [], 'AI_APICallError'],
    'abort-in-tool': ['aborted', [], 'AbortError'],
    'timeout-in-tool': ['timeout', [], 'TimeoutError'],
    'stream-timeout-in-tool': ['timeout', [], 'TimeoutError'],
    'provider-executed-tool': ['stop_condition', ['tool_call:web_search'], null],
    'stream-consumer-stops': ['aborted', [], 'StreamCancelled'],
    'resume-without-stopwhen': ['stop_condition', ['step_count:1'], null],
    'fresh-handle-resume': ['natural_finish', [], null],
    'long-tool-run-active': ['natural_finish', [], null],
    'long-model-call-run-active': ['natural_finish', [], null],
    'prepare-call-swaps-stopwhen': ['stop_condition', ['step_count:1'], null],
  };
  for (const [run, [cause, fired, errorName]] of Object.entries(want)) {
    const [end] = ended(run).slice(-1);
    assert.deepEqual([end.cause, end.fired, end.error_name], [cause, fired, errorName], run);
    assert.equal(end.steered, undefined, `${run} ran without steering`);
  }
  assert.deepEqual(Object.keys(expected).sort(), [...byRun.keys()].sort());
});

test('a tool interrupted by the run\'s abort or timeout is cancelled, not a tool error; a provider tool keeps its flag', () => {
  const calls = (run) => byRun.get(run).filter((e) => e.type === 'step_finished').flatMap((e) => e.tool_calls);
  assert.deepEqual(calls('abort-in-tool').map((c) => [c.name, c.status]), [['slow', 'cancelled']]);
  assert.deepEqual(calls('timeout-in-tool').map((c) => [c.name, c.status]), [['slow', 'cancelled']]);
  assert.deepEqual(
    calls('provider-executed-tool').map((c) => [c.name, c.status, c.provider_executed ?? false]),
    [['search', 'result', false], ['web_search', 'result', true]],
  );
  for (const run of byRun.keys()) {
    for (const call of calls(run)) assert.notEqual(call.status === 'error' && /abort|timeout/.test(run), true, run);
  }
});

test('a segment whose policy is not the run\'s is announced by segment_started before its first step', () => {
  const events = byRun.get('resume-without-stopwhen');
  const started = events.find((e) => e.type === 'run_started');
  const segment = events.find((e) => e.type === 'segment_started');
  assert.deepEqual(started.policy.stop_when, [{ kind: 'step_count', count: 10 }, { kind: 'tool_call', tools: ['done'] }]);
  assert.deepEqual([segment.segment, segment.policy.stop_when], [1, [{ kind: 'step_count', count: 1 }]]);
  assert.ok(events.indexOf(segment) < events.findIndex((e) => e.type === 'step_finished' && e.segment === 1));
  // a prepareCall that swaps stopWhen: announced before the first step, with what it returned
  const swapped = byRun.get('prepare-call-swaps-stopwhen');
  const announced = swapped.find((e) => e.type === 'segment_started');
  assert.deepEqual([announced.segment, announced.policy.stop_when], [0, [{ kind: 'step_count', count: 1 }]]);
  assert.ok(swapped.indexOf(announced) < swapped.findIndex((e) => e.type === 'step_finished'));
  // runs whose every segment runs under the run's policy send none
  for (const run of ['approval-resumed', 'approval-denied', 'natural-verified', 'fresh-handle-resume']) {
    assert.equal(byRun.get(run).filter((e) => e.type === 'segment_started').length, 0, run);
  }
});

test('a resume through a fresh handle of the same client continues the run\'s segment numbering', () => {
  const events = byRun.get('fresh-handle-resume');
  assert.deepEqual(events.filter((e) => e.type === 'run_started').length, 1);
  assert.deepEqual(ended('fresh-handle-resume').map((e) => [e.segment, e.cause]), [[0, 'approval_required'], [1, 'natural_finish']]);
});

test('a resume on a handle that would start at segment 0 is refused at once, before anything is published', async () => {
  const { LoopwardenResumeError } = await import('../dist/index.js');
  const other = new MemorySink();
  const lw = createLoopwarden({ sink: other });
  const agent = new ToolLoopAgent({
    model: scriptedModel([modelStep({ text: 'deployed' })]),
    tools: { deploy: tool({ inputSchema: jsonSchema({ type: 'object' }), execute: async () => 'ok' }) },
    toolApproval: { deploy: 'user-approval' },
    stopWhen: isStepCount(3),
  });
  const resume = [
    { role: 'user', content: 'deploy' },
    {
      role: 'assistant',
      content: [
        { type: 'tool-call', toolCallId: 'c1', toolName: 'deploy', input: {} },
        { type: 'tool-approval-request', approvalId: 'ap-7', toolCallId: 'c1' },
      ],
    },
    { role: 'tool', content: [{ type: 'tool-approval-response', approvalId: 'ap-7', approved: true }] },
  ];
  const started = Date.now();
  await assert.rejects(lw.instrument(agent).run('elsewhere').generate({ messages: resume }), (error) =>
    error instanceof LoopwardenResumeError && /resumes approval "ap-7".*segment 0.*\{ segment:/.test(error.message));
  assert.ok(Date.now() - started < 500, 'at once');
  // with the segment given, it runs and publishes segment 1 (and no run_started)
  await lw.instrument(agent).run('elsewhere', { segment: 1 }).generate({ messages: resume });
  await lw.flush();
  assert.deepEqual(other.events().map((e) => [e.type, e.segment]), [
    ['approval_resolved', undefined], ['segment_started', 1], ['step_finished', 1], ['run_ended', 1],
  ]);
});

test('run_active during a tool longer than a third of the inactivity timeout, naming the tool call', () => {
  const active = byRun.get('long-tool-run-active').filter((e) => e.type === 'run_active');
  assert.ok(active.length >= 2, JSON.stringify(active));
  assert.ok(active.every((e) => e.in === 'tool' && e.tool_call_id === 'c1' && e.segment === 0), JSON.stringify(active));
  assert.equal(byRun.get('natural-verified').filter((e) => e.type === 'run_active').length, 0);
  const model = byRun.get('long-model-call-run-active').filter((e) => e.type === 'run_active');
  assert.ok(model.length >= 2 && model.every((e) => e.in === 'model' && e.tool_call_id === null), JSON.stringify(model));
});

test('steering: a stop evaluated after a text-only step is published as steered (ai >= 7.0.154)', async (t) => {
  const [end] = ended('steered-step-cap').slice(-1);
  if (typeof (await import('ai')).experimental_createSteering === 'function') {
    assert.deepEqual([end.cause, end.fired, end.steered], ['stop_condition', ['step_count:1'], true]);
  } else {
    t.diagnostic('this ai has no experimental steering: the option is ignored and the run ends naturally');
    assert.deepEqual([end.cause, end.fired, end.steered], ['natural_finish', [], undefined]);
  }
  assert.equal(expected['steered-step-cap'], end.steered ? 'BOUNDED_STOP' : 'FALSE_COMPLETE');
});

test('policies: described from stopWhen; a missing stopWhen is null (the 20-step default)', () => {
  const policy = (run) => byRun.get(run)[0].policy;
  assert.deepEqual(policy('step-cap').stop_when, [{ kind: 'step_count', count: 3 }, { kind: 'tool_call', tools: ['done'] }]);
  assert.equal(policy('default-step-cap').stop_when, null);
  assert.deepEqual(policy('token-budget').stop_when, [{ kind: 'step_count', count: 20 }, { kind: 'token_budget', max_tokens: 50 }]);
  assert.deepEqual(policy('tool-error-stop').stop_when[1], { kind: 'custom', name: 'stop-on-tool-error', role: 'bound' });
  assert.equal(policy('step-cap').version, 'e2e-v1');
});

test('approvals: routed data travels in run_ended; a resume is segment 1 after approval_resolved', () => {
  const routed = ended('approval-routed')[0].approval;
  assert.equal(routed.owner, 'ops-oncall');
  assert.equal(routed.resume_token, `resume-${routed.approval_id}`);
  assert.ok(routed.deadline_ts > Date.now());
  assert.equal(routed.tool_name, 'deploy');
  assert.equal(routed.tool_call_id, 'c1');
  assert.deepEqual(ended('approval-unrouted')[0].approval, { ...ended('approval-unrouted')[0].approval, owner: null, deadline_ts: null, resume_token: null });
  const types = byRun.get('approval-resumed').map((e) => `${e.type}${e.segment ?? ''}`);
  assert.deepEqual(types, ['run_started', 'step_finished0', 'run_ended0', 'approval_resolved', 'step_finished1', 'run_ended1', 'outcome_receipt']);
  const resolved = byRun.get('approval-resumed').find((e) => e.type === 'approval_resolved');
  assert.equal(resolved.approval_id, ended('approval-resumed')[0].approval.approval_id);
  assert.equal(resolved.approved, true);
  assert.equal(byRun.get('approval-denied').find((e) => e.type === 'approval_resolved').approved, false);
  assert.equal(byRun.get('approval-routed-later').at(-1).type, 'approval_routed');
});

// --- the agent must not notice -------------------------------------------------------------------

const schema = jsonSchema({ type: 'object' });
function buildAgent(extra = {}) {
  return new ToolLoopAgent({
    model: scriptedModel([
      modelStep({ calls: [['c1', 'search']] }),
      modelStep({ calls: [['c2', 'failing']] }),
      modelStep({ calls: [['c3', 'search']] }),
      modelStep({ text: 'done' }),
    ]),
    tools: {
      search: tool({ inputSchema: schema, execute: async () => `found ${LEAK_MARKER}` }),
      failing: tool({ inputSchema: schema, execute: async () => { throw new Error('nope'); } }),
    },
    stopWhen: [isStepCount(10), hasToolCall('done'), tokenBudget(1000)],
    ...extra,
  });
}
const observable = (result) =>
  JSON.stringify({
    text: result.text,
    finishReason: result.finishReason,
    steps: result.steps.map((s) => ({ n: s.stepNumber, f: s.finishReason, content: s.content, usage: s.usage })),
    messages: result.response.messages,
  });

test('results are identical with and without instrumentation, and every onStepFinish still runs', async () => {
  const plain = await buildAgent().generate({ prompt: 'p' });
  const calls = [];
  const agent = buildAgent({ onStepFinish: (s) => calls.push(`settings:${s.stepNumber}`) });
  const lw = createLoopwarden({ sink: new MemorySink() });
  const watched = await lw.instrument(agent).run('same').generate({ prompt: 'p', onStepFinish: (s) => calls.push(`call:${s.stepNumber}`) });
  assert.equal(observable(watched), observable(plain));
  assert.deepEqual(calls.sort(), ['call:0', 'call:1', 'call:2', 'call:3', 'settings:0', 'settings:1', 'settings:2', 'settings:3']);
  await lw.close();
});

test('a failing sink, a throwing router and a throwing error hook never reach the agent', async () => {
  const internal = [];
  const lw = createLoopwarden({
    sink: { send: () => { throw new Error('kafka down'); }, close: async () => { throw new Error('close failed'); } },
    maxQueue: 3,
    onInternalError: (e) => {
      internal.push(e);
      throw new Error('hook fails too');
    },
    routeApproval: () => { throw new Error('router bug'); },
  });
  const approvalAgent = new ToolLoopAgent({
    model: scriptedModel([modelStep({ calls: [['c1', 'deploy']] })]),
    tools: { deploy: tool({ inputSchema: schema, execute: async () => 'ok' }) },
    toolApproval: { deploy: 'user-approval' },
    stopWhen: isStepCount(5),
  });
  const result = await lw.instrument(approvalAgent).run('r').generate({ prompt: 'p' });
  assert.equal(result.steps.length, 1);
  assert.equal(internal.length, 1, 'the router failure is reported');
  const plain = await buildAgent().generate({ prompt: 'p' });
  const watched = await lw.instrument(buildAgent()).run('r2').generate({ prompt: 'p' });
  assert.equal(observable(watched), observable(plain));
  const stats = await lw.close(50);
  assert.ok(stats.dropped > 0, 'queue overflow is counted');
  assert.equal(stats.published, 0);
});

test('opaque conditions are refused when instrumenting, not during a run', () => {
  const lw = createLoopwarden({ sink: new MemorySink() });
  const agent = buildAgent({ stopWhen: [isStepCount(3), ({ steps }) => steps.length > 2] });
  assert.throws(() => lw.instrument(agent), (e) => e instanceof LoopwardenConfigError && /stopWhen\[1\] is an opaque stop condition/.test(e.message));
  assert.doesNotThrow(() => lw.instrument(buildAgent({ stopWhen: [namedCondition('gt2', 'bound', ({ steps }) => steps.length > 2)] })));
  assert.throws(() => lw.instrument(buildAgent(), { agent: '' }), /agent name must be 1–100 characters/);
  assert.throws(() => lw.instrument(buildAgent()).run(''), /runId must be a string of 1–200 characters/);
  assert.throws(() => createLoopwarden({ sink: new MemorySink(), requiredOutcomes: ['invoice'] }), /requiredOutcomes must be distinct receipt kinds/);
});

test('agent.stream aborted mid-stream ends the segment as aborted', async () => {
  const sink = new MemorySink();
  const lw = createLoopwarden({ sink });
  const controller = new AbortController();
  const agent = new ToolLoopAgent({
    model: new MockLanguageModelV4({
      doStream: async () => ({
        stream: new ReadableStream({
          start(c) {
            c.enqueue({ type: 'stream-start', warnings: [] });
            c.enqueue({ type: 'text-start', id: 't' });
            c.enqueue({ type: 'text-delta', id: 't', delta: 'partial' });
            setTimeout(() => controller.abort(), 20); // never finishes by itself
          },
        }),
      }),
    }),
    stopWhen: isStepCount(3),
  });
  const result = await lw.instrument(agent).run('s').stream({ prompt: 'p', abortSignal: controller.signal });
  await result.consumeStream();
  await lw.flush();
  const events = sink.events();
  assert.deepEqual(events.map((e) => e.type), ['run_started', 'run_ended']);
  assert.equal(events[1].cause, 'aborted');
  assert.equal(events[1].step_count, 0);
});

test('generateText without stopWhen is published as its own default, step_count 1', async () => {
  const sink = new MemorySink();
  const lw = createLoopwarden({ sink, agent: 'plain' });
  const run = lw.run('g');
  const result = await run.generateText({
    model: scriptedModel([modelStep({ calls: [['c1', 'search']] })]),
    tools: { search: tool({ inputSchema: schema, execute: async () => 'x' }) },
    prompt: 'p',
  });
  assert.equal(result.steps.length, 1);
  await lw.flush();
  const [started, step, end] = sink.events();
  assert.deepEqual(started.policy.stop_when, [{ kind: 'step_count', count: 1 }]);
  assert.equal(step.tool_calls[0].status, 'result');
  assert.deepEqual([end.cause, end.fired], ['stop_condition', ['step_count:1']]);
});

// --- the emitter against the SDK on random scripts -------------------------------------------------

test('on 300 random scripts the emitted steps, cause and fired ids match what the SDK did', async () => {
  const FACTORY = {
    step_count: (c) => isStepCount(c.count),
    tool_call: (c) => hasToolCall(...c.tools),
    loop_finished: () => undefined,
    token_budget: (c) => tokenBudget(c.max_tokens),
  };
  const seen = { stopped: 0, other: 0 };
  for (let index = 0; index < 300; index += 1) {
    const drawn = drawCase(42, index);
    const script = [...drawn.steps, { finish: 'stop', calls: [], text: true, usage: { input: 1, output: 1 } }];
    const desired = new Map(script.flatMap((s) => s.calls.map((c) => [c.id, c.status])));
    let evaluatedAt = -1;
    const recorder = namedCondition('recorder', 'completion', ({ steps }) => {
      evaluatedAt = steps.length;
      return false;
    });
    const conditions = drawn.stopWhen.map((c) => FACTORY[c.kind](c)).filter(Boolean);
    let next = 0;
    const agent = new ToolLoopAgent({
      model: new MockLanguageModelV4({
        doGenerate: async () => {
          const s = script[next++] ?? script.at(-1);
          return {
            content: [
              ...(s.text ? [{ type: 'text', text: 't' }] : []),
              ...s.calls.map((c) => ({ type: 'tool-call', toolCallId: c.id, toolName: c.name, input: '{}' })),
            ],
            finishReason: { unified: s.finish, raw: undefined },
            usage: {
              inputTokens: { total: s.usage.input, noCache: undefined, cacheRead: undefined, cacheWrite: undefined },
              outputTokens: { total: s.usage.output, text: undefined, reasoning: undefined },
            },
            warnings: [],
          };
        },
      }),
      tools: Object.fromEntries(
        Object.entries(drawn.executable).map(([name, canRun]) => [
          name,
          tool({
            inputSchema: schema,
            ...(canRun
              ? { execute: async (_i, { toolCallId }) => { if (desired.get(toolCallId) === 'error') throw new Error('x'); return 'ok'; } }
              : {}),
          }),
        ]),
      ),
      maxRetries: 0,
      stopWhen: [recorder, ...conditions],
      toolApproval: ({ toolCall }) => ({ approval_requested: 'user-approval', denied: 'denied' })[desired.get(toolCall.toolCallId)],
    });
    const sink = new MemorySink();
    const lw = createLoopwarden({ sink });
    const result = await lw.instrument(agent).run(`case-${index}`).generate({ prompt: 'p' });
    await lw.flush();
    const events = sink.events();
    const steps = events.filter((e) => e.type === 'step_finished');
    const [end] = events.filter((e) => e.type === 'run_ended');
    const where = `case ${index}: ${JSON.stringify(events)}`;
    assert.equal(steps.length, result.steps.length, where);
    assert.equal(end.step_count, result.steps.length, where);
    const evaluatedAtLast = evaluatedAt === result.steps.length;
    const last = steps.at(-1);
    if (last.finish_reason === 'error' && !last.tool_calls.some((c) => c.status === 'approval_requested')) {
      // the provider failed in the last step (spec rule 2b, after rule 2: approvals): error
      assert.deepEqual([end.cause, end.fired], ['error', []], where);
      seen[evaluatedAtLast ? 'stopped' : 'other'] += 1;
    } else if (evaluatedAtLast) {
      // the loop stopped right after an evaluation: something fired, and `fired` says what
      const truth = [];
      for (const c of drawn.stopWhen) {
        if (c.kind === 'step_count' && result.steps.length === c.count) truth.push(`step_count:${c.count}`);
        if (c.kind === 'tool_call') for (const t of c.tools) if (last.tool_calls.some((x) => x.name === t)) truth.push(`tool_call:${t}`);
        if (c.kind === 'token_budget' && result.steps.reduce((n, s) => n + (s.usage.totalTokens ?? (s.usage.inputTokens ?? 0) + (s.usage.outputTokens ?? 0)), 0) >= c.max_tokens) truth.push(`token_budget:${c.max_tokens}`);
      }
      assert.deepEqual(end.fired, [...new Set(truth)].sort(), where);
      assert.ok(end.fired.length > 0, where);
      assert.ok(['stop_condition', 'tool_error'].includes(end.cause), where);
      seen.stopped += 1;
    } else {
      seen.other += 1;
      assert.deepEqual(end.fired, [], where);
      assert.ok(['natural_finish', 'unexecuted_tool', 'approval_required', 'tool_error'].includes(end.cause), where);
    }
  }
  assert.ok(seen.stopped >= 30 && seen.other >= 30, `both kinds of ending are exercised: ${JSON.stringify(seen)}`);
});

test('a client that goes away under toUIMessageStreamResponse cancels the run (aborted); one that reads it all does not', async () => {
  const usage = { inputTokens: { total: 10 }, outputTokens: { total: 5 } };
  const model = () =>
    new MockLanguageModelV4({
      doStream: async () => ({
        stream: new ReadableStream({
          start(c) {
            for (const p of [
              { type: 'stream-start', warnings: [] },
              { type: 'text-start', id: 't' },
              { type: 'text-delta', id: 't', delta: 'hello' },
              { type: 'text-end', id: 't' },
              { type: 'finish', finishReason: { unified: 'stop', raw: undefined }, usage },
            ]) c.enqueue(p);
            c.close();
          },
        }),
      }),
    });
  const sink = new MemorySink();
  const lw = createLoopwarden({ sink });
  const full = await lw.instrument(new ToolLoopAgent({ model: model(), stopWhen: isStepCount(3) })).run('ui-full').stream({ prompt: 'p' });
  assert.ok((await full.toUIMessageStreamResponse().text()).length > 0);
  const gone = await lw.instrument(new ToolLoopAgent({ model: model(), stopWhen: isStepCount(3) })).run('ui-gone').stream({ prompt: 'p' });
  const reader = gone.toUIMessageStreamResponse().body.getReader();
  await reader.read();
  await reader.cancel();
  await lw.flush();
  const ends = Object.fromEntries(sink.events().filter((e) => e.type === 'run_ended').map((e) => [e.run_id, [e.cause, e.error_name]]));
  assert.deepEqual(ends, { 'ui-full': ['natural_finish', null], 'ui-gone': ['aborted', 'StreamCancelled'] });
});

test('run_active on the streaming path: while the consumer reads and a tool runs, never for a stream nobody reads', async () => {
  const usage = { inputTokens: { total: 10 }, outputTokens: { total: 5 } };
  const streaming = () => {
    let next = 0;
    return new MockLanguageModelV4({
      doStream: async () => {
        const parts = next++ === 0
          ? [{ type: 'tool-call', toolCallId: 'c1', toolName: 'lengthy', input: '{}' }, { type: 'finish', finishReason: { unified: 'tool-calls', raw: undefined }, usage }]
          : [{ type: 'text-start', id: 't' }, { type: 'text-delta', id: 't', delta: 'ok' }, { type: 'text-end', id: 't' }, { type: 'finish', finishReason: { unified: 'stop', raw: undefined }, usage }];
        return { stream: new ReadableStream({ start(c) { c.enqueue({ type: 'stream-start', warnings: [] }); for (const p of parts) c.enqueue(p); c.close(); } }) };
      },
    });
  };
  const lengthy = tool({ inputSchema: jsonSchema({ type: 'object' }), execute: () => new Promise((resolve) => setTimeout(() => resolve('ok'), 1000)) });
  const sink = new MemorySink();
  const lw = createLoopwarden({ sink, inactivityTimeoutS: 0.3 });
  const read = await lw.instrument(new ToolLoopAgent({ model: streaming(), tools: { lengthy }, stopWhen: isStepCount(5) })).run('s-read').stream({ prompt: 'p' });
  await read.consumeStream();
  const idle = await lw.instrument(new ToolLoopAgent({ model: streaming(), tools: { lengthy }, stopWhen: isStepCount(5) })).run('s-idle').stream({ prompt: 'p' });
  await new Promise((resolve) => setTimeout(resolve, 1000)); // nobody reads it
  await idle.fullStream.cancel();
  await lw.flush();
  const active = (run) => sink.events().filter((e) => e.run_id === run && e.type === 'run_active');
  assert.ok(active('s-read').length >= 2 && active('s-read').every((e) => e.in === 'tool' && e.tool_call_id === 'c1'), JSON.stringify(active('s-read')));
  assert.deepEqual(active('s-idle'), []);
  assert.deepEqual(sink.events().filter((e) => e.type === 'run_ended').map((e) => [e.run_id, e.cause]), [['s-read', 'natural_finish'], ['s-idle', 'aborted']]);
});
