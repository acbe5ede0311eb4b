// Every assumption src/sdk-internals.ts makes about the AI SDK, checked against the installed `ai`.
// A failure here means the SDK changed something it never promised: the message names which one.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { ToolLoopAgent, generateText, hasToolCall, isLoopFinished, isStepCount, jsonSchema, streamText, tool } from 'ai';
import { MockLanguageModelV4 } from 'ai/test';
import {
  agentStopWhen,
  DEFAULT_AGENT_STEP_CAP,
  defaultCapFires,
  recogniseSdkClosure,
  sdkEvaluatesAfter,
  streamStepsPromise,
  textDefaultStopWhen,
  withPrepareCall,
} from '../dist/sdk-internals.js';
import { modelStep, scriptedModel } from './e2e/scenarios.mjs';
import { runCase } from './oracle/sdk-oracle.mjs';

const loud = (what) => `the AI SDK changed: ${what} (see src/sdk-internals.ts)`;
const search = () => tool({ inputSchema: jsonSchema({ type: 'object' }), execute: async () => 'ok' });
const callsForever = (n) => Array.from({ length: n }, (_, i) => modelStep({ calls: [[`c${i}`, 'search']] }));

test('1. a ToolLoopAgent keeps its stopWhen in settings.stopWhen', () => {
  const stopWhen = [isStepCount(4)];
  const agent = new ToolLoopAgent({ model: scriptedModel([]), tools: { search: search() }, stopWhen });
  const read = agentStopWhen(agent);
  assert.ok(read.found, loud('ToolLoopAgent no longer has a `settings` object'));
  assert.equal(read.stopWhen, stopWhen, loud('settings.stopWhen is not the stopWhen given'));
  const bare = agentStopWhen(new ToolLoopAgent({ model: scriptedModel([]) }));
  assert.ok(bare.found && bare.stopWhen === undefined, loud('an agent without stopWhen has one in its settings'));
  assert.deepEqual(agentStopWhen({ generate() {} }), { found: false });
});

test(`2. ToolLoopAgent's default stopWhen stops at exactly ${DEFAULT_AGENT_STEP_CAP} steps; generateText's at 1`, async () => {
  globalThis.AI_SDK_LOG_WARNINGS = false;
  const agent = new ToolLoopAgent({ model: scriptedModel(callsForever(DEFAULT_AGENT_STEP_CAP + 5)), tools: { search: search() } });
  const result = await agent.generate({ prompt: 'p' });
  assert.equal(result.steps.length, DEFAULT_AGENT_STEP_CAP, loud(`the agent's default step cap is no longer ${DEFAULT_AGENT_STEP_CAP}`));
  assert.equal(defaultCapFires(result.steps), true);
  assert.equal(defaultCapFires(result.steps.slice(1)), false);
  const text = await generateText({ model: scriptedModel(callsForever(3)), tools: { search: search() }, prompt: 'p' });
  assert.equal(text.steps.length, 1, loud("generateText's default stopWhen no longer stops after one step"));
  const steps = [{}, {}];
  assert.equal(textDefaultStopWhen()({ steps: steps.slice(0, 1) }), true);
  assert.equal(textDefaultStopWhen()({ steps }), false);
});

test('3. sdkEvaluatesAfter is what the SDK does, on 600 oracle cases (steering included where the SDK has it)', async () => {
  let checked = 0;
  for (let i = 0; i < 600; i += 1) {
    const c = await runCase(3, i);
    c.steps.forEach((step, k) => {
      checked += 1;
      assert.equal(sdkEvaluatesAfter(step, step.steered), c.evaluations[k].evaluated,
        loud(`when stopWhen is evaluated (shouldStartNextStep), case ${i} step ${k}: ${JSON.stringify(step)}`));
    });
  }
  assert.ok(checked > 600);
});

test("4. the SDK's own closures are recognised by their source and read back by probing", () => {
  assert.deepEqual(recogniseSdkClosure(isStepCount(7), []), { kind: 'step_count', count: 7 }, loud('isStepCount closure'));
  assert.deepEqual(recogniseSdkClosure(isStepCount(0), []), { kind: 'step_count', count: 0 }, loud('isStepCount(0)'));
  assert.deepEqual(recogniseSdkClosure(hasToolCall('done', 'finish'), ['search', 'done', 'finish']),
    { kind: 'tool_call', tools: ['done', 'finish'] }, loud('hasToolCall closure'));
  assert.deepEqual(recogniseSdkClosure(isLoopFinished(), []), { kind: 'loop_finished' }, loud('isLoopFinished closure'));
  // anything else, however alike, is not recognised
  assert.equal(recogniseSdkClosure(({ steps }) => steps.length === 7, []), undefined);
  assert.equal(recogniseSdkClosure(hasToolCall('other'), ['search']), undefined);
});

test("5. a streamText result's _steps promise settles without the stream being consumed", async () => {
  const model = () => new MockLanguageModelV4({
    doStream: async () => ({
      stream: new ReadableStream({
        start(controller) {
          controller.enqueue({ type: 'stream-start', warnings: [] });
          controller.enqueue({ type: 'text-start', id: 't' });
          controller.enqueue({ type: 'text-delta', id: 't', delta: 'hi' });
          controller.enqueue({ type: 'text-end', id: 't' });
          controller.enqueue({ type: 'finish', finishReason: { unified: 'stop', raw: undefined },
            usage: { inputTokens: { total: 1 }, outputTokens: { total: 1 } } });
          controller.close();
        },
      }),
    }),
  });
  const done = streamText({ model: model(), prompt: 'p' });
  const steps = streamStepsPromise(done);
  assert.ok(steps, loud('streamText results no longer have a `_steps` delayed promise'));
  await done.consumeStream();
  assert.equal((await steps).length, 1, loud('_steps does not resolve with the steps'));

  const controller = new AbortController();
  const aborted = streamText({ model: model(), prompt: 'p', abortSignal: controller.signal });
  const pending = streamStepsPromise(aborted);
  controller.abort();
  await aborted.consumeStream().catch(() => undefined);
  await assert.rejects(pending, loud('_steps no longer rejects when the stream is aborted'));
});

test('6. a ToolLoopAgent copied from its settings with a wrapped prepareCall runs the same, and the wrapper sees what prepareCall returned', async () => {
  globalThis.AI_SDK_LOG_WARNINGS = false;
  const seen = [];
  const swapped = isStepCount(1);
  const agent = new ToolLoopAgent({
    model: scriptedModel(callsForever(5)),
    tools: { search: search() },
    stopWhen: isStepCount(4),
    prepareCall: (args) => ({ ...args, stopWhen: swapped }),
  });
  const copy = withPrepareCall(agent, (original) => async (args) => {
    const out = await original(args);
    seen.push([args.stopWhen, out.stopWhen]);
    return out;
  });
  assert.ok(copy instanceof ToolLoopAgent && copy !== agent, loud('the agent cannot be copied from its settings'));
  assert.equal(agent.settings.prepareCall.name, 'prepareCall', 'the user agent is left as it was');
  const result = await copy.generate({ prompt: 'p' });
  assert.equal(result.steps.length, 1, loud('a copy made from settings does not run under its prepareCall stopWhen'));
  assert.equal(seen.length, 1, loud('prepareCall is not called once per generate()'));
  assert.equal(seen[0][1], swapped);
  assert.equal(withPrepareCall(new ToolLoopAgent({ model: scriptedModel([]) }), (f) => f), undefined);
});
