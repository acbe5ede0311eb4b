#!/usr/bin/env node
// AI SDK 7 ToolLoopAgents on MockLanguageModelV4 (no network), traced by @ai-sdk/otel and exported
// with the OTLP/HTTP protobuf exporter to ENDPOINT, one run per health state the spans can express.
// Prints the expectations as JSON lines on stdout: {agent, state, reason, raised, truth}.
//
// usage: node run.mjs --endpoint http://127.0.0.1:4318/v1/traces [--legacy | --hook]
//   --legacy: the LegacyOpenTelemetry integration (AI SDK <= 6 span shapes: ai.generateText, ...)
//   --hook: the approvals and stop conditions the spans cannot tell, each run with the producer hook's
//           `loopwarden.*` attributes set as docs/opentelemetry.md "The producer hook" shows (`-hook`)
//           and without them (`-bare`)
import { AsyncLocalStorage } from 'node:async_hooks';
import { randomUUID } from 'node:crypto';
import { parseArgs } from 'node:util';
import { OpenTelemetry, LegacyOpenTelemetry } from '@ai-sdk/otel';
import { OTLPTraceExporter } from '@opentelemetry/exporter-trace-otlp-proto';
import { BatchSpanProcessor, TracerProvider } from '@opentelemetry/sdk-trace';
import { ToolLoopAgent, isStepCount, jsonSchema, registerTelemetry, tool } from 'ai';
import { MockLanguageModelV4 } from 'ai/test';

const { values } = parseArgs({ options: { endpoint: { type: 'string' }, legacy: { type: 'boolean', default: false },
  hook: { type: 'boolean', default: false } } });
const SECRET = 's3cr3t-PLANTED-0xC0FFEE';

// the producer hook, as docs/opentelemetry.md shows it: the run in progress, its attributes and open invoke_agent span
const current = new AsyncLocalStorage();
const runSpans = { onStart(span) { if (span.attributes['gen_ai.operation.name'] === 'invoke_agent' && current.getStore()) current.getStore().span = span; },
                   onEnd() {}, forceFlush: async () => {}, shutdown: async () => {} };
const mark = (attrs) => current.getStore()?.span?.setAttributes(attrs);

const exporter = new OTLPTraceExporter({ url: values.endpoint });
const provider = new TracerProvider({
  spanProcessors: [...(values.hook ? [runSpans] : []), new BatchSpanProcessor({ exporter, scheduledDelayMillis: 200 })],
});
// the scope names the integrations use on the global provider: `gen_ai` (OpenTelemetry), `ai` (legacy)
const telemetry = values.legacy
  ? new LegacyOpenTelemetry({ tracer: provider.getTracer('ai') })
  : new OpenTelemetry({ tracer: provider.getTracer('gen_ai'),
    ...(values.hook ? { enrichSpan: () => current.getStore()?.attributes } : {}) });
registerTelemetry(telemetry);

const usage = { inputTokens: { total: 10 }, outputTokens: { total: 5 } };
const step = (calls, text) => ({
  content: [
    ...(text ? [{ type: 'text', text: `${text} ${SECRET}` }] : []),
    ...calls.map(([id, name]) => ({ type: 'tool-call', toolCallId: id, toolName: name, input: JSON.stringify({ q: SECRET }) })),
  ],
  finishReason: { unified: calls.length ? 'tool-calls' : 'stop', raw: undefined },
  usage,
  warnings: [],
});
const scripted = (steps) => {
  let next = 0;
  return new MockLanguageModelV4({
    doGenerate: async ({ abortSignal }) => {
      const s = steps[next++];
      if (s instanceof Error) throw s;
      if (s === 'hang') {
        return await new Promise((_, reject) => {
          const keep = setTimeout(() => reject(new Error('hung')), 30_000);
          abortSignal?.addEventListener('abort', () => { clearTimeout(keep); reject(abortSignal.reason); }, { once: true });
        });
      }
      return s;
    },
  });
};
const schema = jsonSchema({ type: 'object', properties: { q: { type: 'string' } } });
const tools = {
  lookup: tool({ description: 'look up', inputSchema: schema, execute: async () => ({ found: SECRET }) }),
  boom: tool({ description: 'fails', inputSchema: schema, execute: async () => { throw new Error(`tool failed ${SECRET}`); } }),
  pay: tool({ description: 'pay, after approval', inputSchema: schema, needsApproval: true, execute: async () => ({ paid: SECRET }) }),
  // the same tool whose approval the hook records, routed (owner, deadline, resume token) when the run says so
  payMarked: tool({
    description: 'pay, after approval', inputSchema: schema, execute: async () => ({ paid: SECRET }),
    needsApproval: async (input, { toolCallId }) => {
      mark({ 'loopwarden.stop.cause': 'approval_required', 'loopwarden.approval.id': toolCallId,
        'loopwarden.approval.tool_call_id': toolCallId, 'loopwarden.approval.tool_name': 'payMarked',
        ...current.getStore()?.route });
      return true;
    },
  }),
};
// a stopWhen function that records what fired (an id its policy declares as a bound)
const stepBudget = (n) => async (options) => {
  const hit = await isStepCount(n)(options);
  if (hit) mark({ 'loopwarden.stop.cause': 'stop_condition', 'loopwarden.stop.fired': ['custom:step_budget'] });
  return hit;
};
const BUDGET_POLICY = { version: 'ai-sdk-budget@1', stop_when: [{ kind: 'custom', name: 'step_budget', role: 'bound' }] };

async function attempt(agentName, steps, { stopWhen, abort, timeout } = {}) {
  const agent = new ToolLoopAgent({ model: scripted(steps), tools, stopWhen: stopWhen ?? isStepCount(10) });
  const controller = new AbortController();
  if (abort) setTimeout(() => controller.abort(), abort);
  try {
    await agent.generate({
      prompt: `task ${SECRET}`,
      abortSignal: controller.signal,
      timeout,
      telemetry: { functionId: agentName },
    });
    return null;
  } catch (err) {
    return err?.name ?? String(err);
  }
}

const out = [];
const expect = (agent, state, reason, raised, truth = null) => out.push({ agent, state, reason, raised, truth });

// one run inside the hook's scope: enrichSpan gives every span of it `attributes` from its start
const hooked = (attributes, route, run) => current.run({ attributes: { 'loopwarden.run.id': randomUUID(), ...attributes }, route }, run);

if (values.hook) {
  // a run hung in its second model call, never awaited: its first step's spans go out, its run span never
  // does. Named by `loopwarden.agent` (the AI SDK names the agent on its run span only), and bare.
  hooked({ 'loopwarden.agent': 'sdk-hung-hooked' }, {}, () => attempt('sdk-hung-hooked', [step([['c1', 'lookup']]), 'hang']));
  attempt('sdk-hung-unhooked', [step([['c1', 'lookup']]), 'hang']);
  // published at once under its name, RUNNING until the inactivity timeout makes it STUCK; the bare one waits
  // start_grace_s (30 s) for a name no span of it gives
  expect('sdk-hung-hooked', 'RUNNING', 'started', null);
  const approval = [step([['c1', 'payMarked']])];
  const route = { 'loopwarden.approval.owner': 'ops', 'loopwarden.approval.deadline_ts': Date.now() + 3_600_000,
    'loopwarden.approval.resume_token': 'resume-c1' };
  const looping = [step([['c1', 'lookup']]), step([['c2', 'lookup']]), step([['c3', 'lookup']])];
  expect('sdk-approval-hook', 'WAITING_UNROUTED', 'approval_required',
    await hooked({}, {}, () => attempt('sdk-approval-hook', approval)));
  expect('sdk-approval-routed-hook', 'WAITING', 'approval_required',
    await hooked({}, route, () => attempt('sdk-approval-routed-hook', approval)));
  expect('sdk-step-budget-hook', 'BOUNDED_STOP', 'stop_condition',
    await hooked({ 'loopwarden.policy': JSON.stringify(BUDGET_POLICY) }, {},
      () => attempt('sdk-step-budget-hook', looping, { stopWhen: stepBudget(2) })));
  // the same runs outside any scope: no attribute, and the spans alone cannot say why they stopped
  expect('sdk-approval-bare', 'UNCERTAIN', 'cause_mismatch', await attempt('sdk-approval-bare', approval), 'approval_required');
  expect('sdk-step-budget-bare', 'UNCERTAIN', 'cause_not_recorded',
    await attempt('sdk-step-budget-bare', looping, { stopWhen: stepBudget(2) }), 'stop_condition');
  await provider.forceFlush();
  await provider.shutdown();
  for (const e of out) process.stdout.write(`${JSON.stringify(e)}\n`);
  process.exit(0);
}

expect('sdk-natural', 'VERIFYING', 'natural_finish', await attempt('sdk-natural', [step([['c1', 'lookup']]), step([], 'done')]));
// a tool error is handed back to the model, which answers: a natural finish (tool_errors 1 in evidence)
expect('sdk-tool-error', 'VERIFYING', 'natural_finish', await attempt('sdk-tool-error', [step([['c1', 'boom']]), step([], 'sorry')]));
// needsApproval: the loop stops with the call awaiting approval; no tool span, no marker: the last step
// asked for a tool and ended OK: the cause is not recorded (reported unknown, derived natural_finish)
expect('sdk-approval', 'UNCERTAIN', 'cause_mismatch', await attempt('sdk-approval', [step([['c1', 'pay']])]), 'approval_required');
// isStepCount(2) while the model keeps calling tools: every span OK, the spans cannot say which condition
expect('sdk-step-cap', 'UNCERTAIN', 'cause_not_recorded',
  await attempt('sdk-step-cap', [step([['c1', 'lookup']]), step([['c2', 'lookup']]), step([['c3', 'lookup']])], { stopWhen: isStepCount(2) }),
  'stop_condition');
// the model throws: chat, step and invoke_agent spans ERROR
expect('sdk-exception', 'FAILED', 'error', await attempt('sdk-exception', [new Error(`provider exploded ${SECRET}`)]));
// abort while the model call hangs: the spans record the AbortError
expect('sdk-aborted', 'BOUNDED_STOP', 'aborted', await attempt('sdk-aborted', [step([['c1', 'lookup']]), 'hang'], { abort: 300 }));
// the call's own total timeout while the model call hangs
expect('sdk-timeout', 'STUCK', 'timeout', await attempt('sdk-timeout', [step([['c1', 'lookup']]), 'hang'], { timeout: 300 }));

await provider.forceFlush();
await provider.shutdown();
for (const e of out) process.stdout.write(`${JSON.stringify(e)}\n`);
