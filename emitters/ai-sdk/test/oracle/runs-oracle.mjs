#!/usr/bin/env node
// Whole-run oracle: what a user of loopwarden sees, against what the real AI SDK did.
//
//   node test/oracle/runs-oracle.mjs --seed S --runs N --out DIR
//
// Draws N seeded random runs and plays each on a real ToolLoopAgent (MockLanguageModelV4, no
// network) instrumented by this package, publishing to a MemorySink. Runs cover every condition
// kind (step count, tool call, loop finished, token budget, custom bound and completion, the
// agent's default cap of 20) and every way a run ends: a natural finish, a stop condition, an
// unexecuted tool, a tool error, an approval request (and 70 % of those resumed as the next
// segment, approved or denied), an abort between steps, a step timeout, a provider error,
// steering, and streaming (agent.stream) instead of generate. 40 % of runs get a verified receipt
// afterwards.
//
// Writes DIR/events.jsonl (every event the emitter published, in order: what `loopwarden replay`
// reads) and DIR/facts.jsonl, one line per run with what the SDK itself showed, observed here and
// not by the emitter: per segment the steps it executed (its stop point), whether and how the call
// rejected, whether it evaluated stopWhen after the last step (a recorder condition of our own,
// `custom:oracle-recorder`, that never fires) and which of the policy's real conditions were true
// then; and the receipt. tests/e2e/test_sdk_oracle.py replays the events and compares the
// emitter's events, the evaluator's derived cause and the final state with these facts.
import { mkdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';
import { parseArgs } from 'node:util';
import * as ai from 'ai';
import { ToolLoopAgent } from 'ai';
import { MockLanguageModelV4 } from 'ai/test';
import {
  MemorySink,
  createLoopwarden,
  hasToolCall,
  isLoopFinished,
  isStepCount,
  namedCondition,
  summarizeStep,
  tokenBudget,
} from '../../dist/index.js';
import {
  TERMINAL,
  drawCase,
  int,
  modelResponse,
  realConditions,
  rngFor,
  scriptedApproval,
  scriptedTools,
  weighted,
} from './sdk-oracle.mjs';
import { hangUntilAborted } from '../e2e/scenarios.mjs';

const createSteering = typeof ai.experimental_createSteering === 'function' ? ai.experimental_createSteering : null;
const HANG = Symbol('hang');
const FAIL = Symbol('provider error');

// The package's factories (the same SDK closures, remembered), for the drawn wire conditions.
function packageCondition(condition) {
  switch (condition.kind) {
    case 'step_count':
      return isStepCount(condition.count);
    case 'tool_call':
      return hasToolCall(...condition.tools);
    case 'loop_finished':
      return isLoopFinished();
    case 'token_budget':
      return tokenBudget(condition.max_tokens);
    default:
      throw new Error(condition.kind);
  }
}

const CUSTOM = {
  // a bound: two tool errors in the segment so far
  'two-errors': { role: 'bound', fn: ({ steps }) => steps.flatMap((s) => s.content).filter((p) => p.type === 'tool-error').length >= 2 },
  // a completion: the last step wrote a record
  wrote: { role: 'completion', fn: ({ steps }) => (steps.at(-1)?.toolResults ?? []).some((r) => r.toolName === 'write') },
};

function drawRun(seed, index) {
  const drawn = drawCase(seed, index);
  const rng = rngFor(seed ^ 0xa11ce, index);
  const mode = weighted(rng, [['drawn', 7], ['custom', 2], ['default-cap', 1]]);
  let { steps, stopWhen, executable } = drawn;
  if (mode === 'default-cap') {
    executable = { ...executable, search: true };
    steps = Array.from({ length: int(rng, 22, 26) }, (_, k) => ({
      finish: 'tool-calls',
      calls: [{ id: `c${k}_0`, name: 'search', status: 'result' }],
      text: false,
      usage: { input: 3, output: 2, total: 5 },
      steer: false,
    }));
    stopWhen = null;
  }
  const ending = weighted(rng, [['plain', 11], ['stream', 3], ['abort', 2], ['timeout', 2], ['error', 2]]);
  const at = int(rng, 0, Math.max(0, steps.length - 1));
  return {
    mode,
    steps,
    stopWhen,
    executable,
    custom: mode === 'custom' ? Object.keys(CUSTOM) : [],
    ending,
    at, // abort after step `at`; the model hangs or fails at step `at`
    resume: rng() < 0.7 ? (rng() < 0.5 ? 'approve' : 'deny') : null,
    receipt: rng() < 0.4,
  };
}

function streamingResponse(step) {
  const parts = [{ type: 'stream-start', warnings: [] }];
  if (step.text) parts.push({ type: 'text-start', id: 't' }, { type: 'text-delta', id: 't', delta: 'scripted' }, { type: 'text-end', id: 't' });
  for (const call of step.calls) parts.push({ type: 'tool-call', toolCallId: call.id, toolName: call.name, input: '{}' });
  const { usage, finishReason } = modelResponse(step);
  parts.push({ type: 'finish', finishReason, usage });
  return { stream: new ReadableStream({ start(c) { parts.forEach((p) => c.enqueue(p)); c.close(); } }) };
}

/** Play one run; returns its facts. Events go to `lw`. */
export async function playRun(lw, seed, index) {
  const run = drawRun(seed, index);
  const runId = `o${seed}-${index}`;
  const script = [...run.steps, TERMINAL];
  if (run.ending === 'timeout') script[run.at] = HANG;
  if (run.ending === 'error') script[run.at] = FAIL;
  const desired = new Map(run.steps.flatMap((s) => s.calls.map((c) => [c.id, c.status])));
  const steering = createSteering && run.ending !== 'stream' && run.steps.some((s) => s.steer) ? createSteering() : undefined;
  let next = 0;
  const nextStep = () => script[next++] ?? TERMINAL;
  const model = new MockLanguageModelV4({
    doGenerate: async (options) => {
      const step = nextStep();
      if (step === HANG) return hangUntilAborted(options.abortSignal);
      if (step === FAIL) throw new Error('provider unavailable');
      if (step.steer) void steering?.steer('steered');
      return modelResponse(step);
    },
    doStream: async () => streamingResponse(nextStep()),
  });

  let evaluated = new Set();
  const recorder = namedCondition('oracle-recorder', 'completion', ({ steps }) => {
    evaluated.add(steps.length);
    return false;
  });
  const real = [
    ...(run.stopWhen ?? []).flatMap(realConditions).map(({ ids, fn }) => ({ ids, fn })),
    ...run.custom.map((name) => ({ ids: [`custom:${name}`], fn: CUSTOM[name].fn })),
  ];
  const stopWhen =
    run.stopWhen === null
      ? undefined
      : [recorder, ...run.stopWhen.map(packageCondition), ...run.custom.map((name) => namedCondition(name, CUSTOM[name].role, CUSTOM[name].fn))];
  const tools = scriptedTools(run.executable, desired);
  const agent = new ToolLoopAgent({
    model,
    tools,
    maxRetries: 0,
    ...(stopWhen ? { stopWhen } : {}),
    toolApproval: scriptedApproval(desired),
  });
  const handle = lw.instrument(agent).run(runId);

  const segments = [];
  let messages = [{ role: 'user', content: 'oracle' }];
  for (let segment = 0; segment < 3; segment += 1) {
    evaluated = new Set();
    const seen = [];
    const controller = new AbortController();
    const abortAfter = run.ending === 'abort' && segment === 0 ? run.at : -1;
    const params = {
      messages,
      abortSignal: controller.signal,
      onStepFinish: (step) => {
        seen.push(step);
        if (seen.length - 1 === abortAfter) controller.abort();
      },
      ...(run.ending === 'timeout' ? { timeout: { stepMs: 40 } } : {}),
      ...(steering && segment === 0 ? { experimental_steering: steering } : {}),
    };
    let rejected = null;
    let result;
    try {
      if (run.ending === 'stream') {
        result = await handle.stream(params);
        await result.consumeStream();
        await result.steps;
      } else {
        result = await handle.generate(params);
      }
    } catch (error) {
      rejected = { name: error?.name ?? 'Error', aborted: controller.signal.aborted };
    }
    const summaries = seen.map((s, i) => summarizeStep(s, i));
    const last = seen.at(-1);
    const firedAtLast = [];
    if (last) for (const { ids, fn } of real) if (await fn({ steps: seen })) firedAtLast.push(...ids);
    // The agent's default cap runs without our recorder: that it stopped the run shows in the stop
    // point itself, 20 steps executed of a script of more tool-call steps.
    const capStopped = run.stopWhen === null && !rejected && seen.length === 20 && run.steps.length > 20;
    if (capStopped) firedAtLast.push('step_count:20');
    segments.push({
      steps: seen.length,
      rejected,
      evaluated_at_last: capStopped || (seen.length > 0 && evaluated.has(seen.length)),
      fired_at_last: [...new Set(firedAtLast)].sort(),
      last_statuses: summaries.at(-1)?.tool_calls.map((c) => c.status) ?? [],
      last_finish: summaries.at(-1)?.finish_reason ?? null,
    });
    const requests = last?.content.filter((p) => p.type === 'tool-approval-request') ?? [];
    // Resumed as a user would: when every call of the last step waits for an approval.
    const onlyApprovals = requests.length > 0 && summaries.at(-1).tool_calls.every((c) => c.status === 'approval_requested');
    if (rejected || !onlyApprovals || run.resume === null || !result) break;
    const response = await result.response; // a promise on a stream's result
    messages = [
      ...messages,
      ...response.messages,
      { role: 'tool', content: requests.map((r) => ({ type: 'tool-approval-response', approvalId: r.approvalId, approved: run.resume === 'approve' })) },
    ];
  }
  if (run.receipt) {
    lw.publishReceipt({ runId, receiptId: `${runId}/r`, kind: 'record', verifier: 'destination', verified: true });
  }
  const roles = Object.fromEntries([
    ...(run.stopWhen ?? []).flatMap((c) => realConditions(c).flatMap(({ ids }) => ids.map((id) => [id, c.kind === 'tool_call' ? 'completion' : 'bound']))),
    ...run.custom.map((name) => [`custom:${name}`, CUSTOM[name].role]),
    ...(run.stopWhen === null ? [['step_count:20', 'bound']] : []),
  ]);
  return {
    run_id: runId,
    mode: run.mode,
    ending: run.ending,
    kinds: [...new Set([...(run.stopWhen ?? [{ kind: 'default_cap' }]).map((c) => c.kind), ...run.custom.map(() => 'custom')])].sort(),
    steered: Boolean(steering),
    receipt: run.receipt,
    roles,
    segments,
  };
}

async function main() {
  const { values } = parseArgs({
    options: { seed: { type: 'string', default: '1' }, runs: { type: 'string', default: '500' }, out: { type: 'string' } },
  });
  const seed = Number.parseInt(values.seed, 10);
  const runs = Number.parseInt(values.runs, 10);
  if (!values.out || !Number.isSafeInteger(seed) || !Number.isSafeInteger(runs) || runs < 0) {
    process.stderr.write('usage: runs-oracle.mjs --seed S --runs N --out DIR\n');
    process.exit(2);
  }
  globalThis.AI_SDK_LOG_WARNINGS = false;
  const sink = new MemorySink();
  const lw = createLoopwarden({ sink, agent: 'oracle-agent', policyVersion: 'oracle-v1', maxQueue: 10_000_000 });
  const facts = [];
  for (let i = 0; i < runs; i += 1) facts.push(JSON.stringify(await playRun(lw, seed, i)));
  const stats = await lw.close(30_000);
  if (stats.dropped > 0 || stats.internalErrors > 0) throw new Error(`emitter dropped ${stats.dropped}, internal errors ${stats.internalErrors}`);
  mkdirSync(values.out, { recursive: true });
  writeFileSync(join(values.out, 'events.jsonl'), sink.jsonl());
  writeFileSync(join(values.out, 'facts.jsonl'), `${facts.join('\n')}\n`);
  process.stdout.write(`${runs} runs, ${sink.records.length} events -> ${values.out}\n`);
}

if (process.argv[1] && import.meta.url === pathToFileURL(process.argv[1]).href) {
  await main();
}
