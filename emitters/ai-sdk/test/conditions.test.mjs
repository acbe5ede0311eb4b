// Policy recognition: the package's factories, plain SDK closures, opaque conditions.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import * as sdk from 'ai';
import {
  describeCondition,
  hasToolCall,
  isLoopFinished,
  isStepCount,
  LoopwardenConfigError,
  namedCondition,
  stepCountIs,
  stepTokens,
  tokenBudget,
} from '../dist/index.js';

const ctx = { toolNames: ['search', 'done', 'write'], where: 'stopWhen[0]' };
const steps = (n, last = {}) => Array.from({ length: n }, (_, i) => (i === n - 1 ? last : {}));

test('factories return conditions that behave like the SDK ones and remember what they are', () => {
  const rows = [
    [isStepCount(3), { kind: 'step_count', count: 3 }, sdk.isStepCount(3)],
    [stepCountIs(0), { kind: 'step_count', count: 0 }, sdk.isStepCount(0)],
    [hasToolCall('done', 'finish'), { kind: 'tool_call', tools: ['done', 'finish'] }, sdk.hasToolCall('done', 'finish')],
    [isLoopFinished(), { kind: 'loop_finished' }, sdk.isLoopFinished()],
  ];
  const probes = [steps(1), steps(3), steps(2, { toolCalls: [{ toolName: 'done' }] }), steps(3, { toolCalls: [{ toolName: 'x' }] })];
  for (const [ours, description, theirs] of rows) {
    assert.deepEqual(describeCondition(ours, ctx), description);
    for (const probe of probes) assert.equal(ours({ steps: probe }), theirs({ steps: probe }));
  }
});

test('plain SDK closures are recognised: isStepCount by probing, hasToolCall for the agent tool names', () => {
  assert.deepEqual(describeCondition(sdk.isStepCount(20), ctx), { kind: 'step_count', count: 20 });
  assert.deepEqual(describeCondition(sdk.stepCountIs(7), ctx), { kind: 'step_count', count: 7 });
  assert.deepEqual(describeCondition(sdk.isLoopFinished(), ctx), { kind: 'loop_finished' });
  assert.deepEqual(describeCondition(sdk.hasToolCall('done', 'write', 'elsewhere'), ctx), { kind: 'tool_call', tools: ['done', 'write'] });
});

test('an opaque condition is refused at set-up with a message that says how to name it', () => {
  const opaque = ({ steps: s }) => s.length > 3;
  assert.throws(() => describeCondition(opaque, ctx), (e) => e instanceof LoopwardenConfigError && /stopWhen\[0\] is an opaque stop condition; wrap it as namedCondition/.test(e.message));
  // an SDK hasToolCall for tools the agent does not have cannot be read back
  assert.throws(() => describeCondition(sdk.hasToolCall('nope'), ctx), LoopwardenConfigError);
  assert.deepEqual(describeCondition(namedCondition('long-run', 'bound', opaque), ctx), { kind: 'custom', name: 'long-run', role: 'bound' });
});

test('namedCondition returns the wrapped result unchanged, sync or async', async () => {
  const sync = namedCondition('a', 'completion', () => true);
  const later = namedCondition('b', 'bound', async () => false);
  assert.equal(sync({ steps: [] }), true);
  assert.equal(await later({ steps: [] }), false);
});

test('tokenBudget sums total_tokens, else input + output, missing = 0; fires at >= max', () => {
  const u = (inputTokens, outputTokens, totalTokens) => ({ usage: { inputTokens, outputTokens, totalTokens } });
  assert.equal(stepTokens(u(10, 5, 100).usage), 100);
  assert.equal(stepTokens(u(10, 5, undefined).usage), 15);
  assert.equal(stepTokens(u(undefined, undefined, undefined).usage), 0);
  assert.equal(stepTokens(undefined), 0);
  const budget = tokenBudget(50);
  assert.equal(budget({ steps: [u(10, 5, 30), u(undefined, 19, undefined)] }), false);
  assert.equal(budget({ steps: [u(10, 5, 30), u(undefined, 20, undefined)] }), true);
  assert.deepEqual(describeCondition(budget, ctx), { kind: 'token_budget', max_tokens: 50 });
});

test('bad factory arguments fail fast with the value named', () => {
  assert.throws(() => isStepCount(-1), /isStepCount\(count\) must be an integer >= 0, got -1/);
  assert.throws(() => tokenBudget(0), /tokenBudget\(maxTokens\) must be an integer >= 1, got 0/);
  assert.throws(() => hasToolCall(), /needs 1–100 tool names, got 0/);
  assert.throws(() => namedCondition('', 'bound', () => true), /needs a name of 1–200 characters/);
  assert.throws(() => namedCondition('x', 'maybe', () => true), /role must be 'bound' or 'completion', got maybe/);
});
