#!/usr/bin/env node
// Differential oracle for stop conditions, answered by the real AI SDK (npm `ai`, installed).
//
//   node test/oracle/sdk-oracle.mjs --seed S --cases N
//
// For each case it draws a random content-free step script (tool calls meant to end as
// result / error / pending / approval_requested / denied, finish reasons from the unified set,
// usage with any count possibly absent) and a random policy (step_count n >= 0, tool_call, loop_finished,
// token_budget), then *runs a real ToolLoopAgent* on MockLanguageModelV4 playing that script,
// with the policy's real conditions (`isStepCount`, `hasToolCall`, `isLoopFinished` from `ai`,
// `tokenBudget` from this package) plus a recorder that notes every evaluation. It prints one
// JSON line per case:
//
//   {"case": i, "stop_when": [Condition...], "steps": [{"finish_reason", "tool_calls": [{"id","name","status"}],
//    "usage": {"input_tokens","output_tokens","total_tokens"}, "steered": bool}],
//    "evaluations": [{"step": k, "evaluated": bool, "fired": [condition ids, sorted]}]}
//
// - `steps` are the steps the SDK actually executed (the script is cut where the SDK stopped); the
//   statuses are read from each real step's content parts (the emitter's own reading), so a call
//   scripted as `result` in a `length` step shows up as `pending`, as the SDK left it.
// - `evaluated` (step k) is true iff the SDK called stopWhen after step k: observed, not re-derived.
// - `fired` (step k) lists the ids whose real condition returns true on the SDK step objects of
//   steps[0..k]; a `tool_call` condition yields one id per tool name, each asked of the real
//   `hasToolCall(name)`.
// - usage: the SDK computes a step's totalTokens from input + output, so a provider cannot report
//   "total absent, input present". To cover such usage anyway, every condition (in the run and for
//   `fired`) sees the real step objects with `usage` replaced by the drawn usage (a prototype
//   overlay); all other fields are the real ones. The printed usage is the drawn usage.
//
// - `steered` (step k): with an `ai` that has experimental steering, 30 % of the scripted steps send
//   a steering message while they are generated, so one is waiting when the step ends; the SDK
//   then evaluates stopWhen even after a step without tool calls.
//
// Seeded (mulberry32 per case: the same seed and case index give the same line, whatever N).
import { pathToFileURL } from 'node:url';
import { parseArgs } from 'node:util';
import * as ai from 'ai';
import { ToolLoopAgent, hasToolCall, isLoopFinished, isStepCount, jsonSchema, tool } from 'ai';
import { MockLanguageModelV4 } from 'ai/test';
import { summarizeStep, tokenBudget } from '../../dist/index.js';

const FINISH = ['stop', 'length', 'content-filter', 'tool-calls', 'error', 'interrupted', 'other'];
// Experimental steering (ai >= 7.0.154): absent from older versions, whose cases never steer.
const createSteering = typeof ai.experimental_createSteering === 'function' ? ai.experimental_createSteering : null;
export const TOOLS = ['search', 'write', 'done', 'lookup'];
const UNKNOWN_TOOL = 'ghost'; // not in the agent's tools: the SDK turns the call into a tool error

function mulberry32(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

export function rngFor(seed, index) {
  // Mix seed and case index so that each case has its own stream.
  return mulberry32((Math.imul(seed >>> 0, 0x9e3779b1) ^ Math.imul(index + 1, 0x85ebca6b)) >>> 0);
}

export const pick = (rng, items) => items[Math.floor(rng() * items.length)];
export const int = (rng, lo, hi) => lo + Math.floor(rng() * (hi - lo + 1));
const maybe = (rng, p, value) => (rng() < p ? value() : undefined);

export function weighted(rng, table) {
  let r = rng() * table.reduce((sum, [, w]) => sum + w, 0);
  for (const [value, w] of table) {
    r -= w;
    if (r < 0) return value;
  }
  return table[table.length - 1][0];
}

function drawUsage(rng) {
  const input = maybe(rng, 0.8, () => int(rng, 0, 400));
  const output = maybe(rng, 0.8, () => int(rng, 0, 400));
  const total = weighted(rng, [
    [() => undefined, 3],
    [() => (input ?? 0) + (output ?? 0), 4],
    [() => int(rng, 0, 800), 3],
  ])();
  return { input, output, total };
}

/** A random case: which tools can execute, the scripted steps, the policy. */
export function drawCase(seed, index) {
  const rng = rngFor(seed, index);
  const executable = Object.fromEntries(TOOLS.map((name) => [name, rng() < 0.8]));
  const steps = [];
  const nSteps = int(rng, 1, 7);
  for (let k = 0; k < nSteps; k += 1) {
    const finish = weighted(rng, [
      ['tool-calls', 45],
      ['stop', 20],
      ['length', 7],
      ['content-filter', 7],
      ['error', 7],
      ['interrupted', 7],
      ['other', 7],
    ]);
    const nCalls = finish === 'tool-calls' ? int(rng, 1, 3) : weighted(rng, [[0, 5], [1, 3], [2, 2]]);
    const calls = [];
    for (let j = 0; j < nCalls; j += 1) {
      const name = rng() < 0.05 ? UNKNOWN_TOOL : pick(rng, TOOLS);
      const status = executable[name]
        ? weighted(rng, [['result', 60], ['error', 15], ['approval_requested', 10], ['denied', 15]])
        : weighted(rng, [['pending', 60], ['approval_requested', 20], ['denied', 20]]);
      calls.push({ id: `c${k}_${j}`, name, status });
    }
    steps.push({ finish, calls, text: calls.length === 0 || rng() < 0.3, usage: drawUsage(rng) });
  }
  const stopWhen = [];
  const nConditions = weighted(rng, [[0, 1], [1, 4], [2, 4], [3, 2], [4, 1]]);
  for (let c = 0; c < nConditions; c += 1) {
    const kind = weighted(rng, [['step_count', 4], ['tool_call', 3], ['loop_finished', 1], ['token_budget', 2]]);
    if (kind === 'step_count') stopWhen.push({ kind, count: int(rng, 0, 8) });
    else if (kind === 'tool_call') {
      const tools = [...new Set([pick(rng, TOOLS), ...(rng() < 0.4 ? [pick(rng, [...TOOLS, 'finish'])] : [])])];
      stopWhen.push({ kind, tools });
    } else if (kind === 'loop_finished') stopWhen.push({ kind });
    else stopWhen.push({ kind, max_tokens: int(rng, 1, 1500) });
  }
  // Steering from a stream of its own, so the draws above are the same with and without it: a
  // steered step sends a steering message while it is generated, so one is waiting when it ends.
  const steerRng = rngFor(seed ^ 0x5eed, index);
  for (const step of steps) step.steer = createSteering !== null && steerRng() < 0.3;
  return { executable, steps, stopWhen };
}

/** The real SDK condition(s) of one spec Condition, each with the ids it stands for. */
export function realConditions(condition) {
  switch (condition.kind) {
    case 'step_count':
      return [{ ids: [`step_count:${condition.count}`], fn: isStepCount(condition.count) }];
    case 'tool_call':
      // one real hasToolCall per name, so that each id is answered by the SDK itself
      return condition.tools.map((name) => ({ ids: [`tool_call:${name}`], fn: hasToolCall(name) }));
    case 'loop_finished':
      return [{ ids: [], fn: isLoopFinished() }];
    case 'token_budget':
      return [{ ids: [`token_budget:${condition.max_tokens}`], fn: tokenBudget(condition.max_tokens) }];
    default:
      throw new Error(`unknown condition kind ${condition.kind}`);
  }
}

function providerUsage({ input, output }) {
  return {
    inputTokens: { total: input, noCache: undefined, cacheRead: undefined, cacheWrite: undefined },
    outputTokens: { total: output, text: undefined, reasoning: undefined },
  };
}

export function modelResponse(step) {
  const content = [];
  if (step.text) content.push({ type: 'text', text: 'scripted' });
  for (const call of step.calls) content.push({ type: 'tool-call', toolCallId: call.id, toolName: call.name, input: '{}' });
  return { content, finishReason: { unified: step.finish, raw: step.finish }, usage: providerUsage(step.usage), warnings: [] };
}

/** The agent's tools: `executable[name]` ones run (and throw for calls scripted as `error`). */
export function scriptedTools(executable, desired) {
  return Object.fromEntries(
    TOOLS.map((name) => [
      name,
      tool({
        inputSchema: jsonSchema({ type: 'object' }),
        ...(executable[name]
          ? {
              execute: async (_input, { toolCallId }) => {
                if (desired.get(toolCallId) === 'error') throw new Error('scripted tool error');
                return 'ok';
              },
            }
          : {}),
      }),
    ]),
  );
}

/** toolApproval answering each call as scripted: approval requested, denied, or neither. */
export function scriptedApproval(desired) {
  return ({ toolCall }) => {
    const status = desired.get(toolCall.toolCallId);
    if (status === 'approval_requested') return 'user-approval';
    if (status === 'denied') return 'denied';
    return undefined;
  };
}

export const TERMINAL = { finish: 'stop', calls: [], text: true, usage: { input: 1, output: 1, total: 2 } };

/** Run one case on the real SDK and return its output line (as an object). */
export async function runCase(seed, index) {
  const drawn = drawCase(seed, index);
  // The script ends with a text-only `stop` step, so the loop always has an end.
  const script = [...drawn.steps, TERMINAL];
  const desired = new Map(script.flatMap((s) => s.calls.map((c) => [c.id, c.status])));

  // Conditions see the real steps with the drawn usage in place of the SDK's.
  const overlay = (steps) =>
    steps.map((step, i) => {
      const u = (script[i] ?? TERMINAL).usage;
      return Object.create(step, {
        usage: { value: { ...step.usage, inputTokens: u.input, outputTokens: u.output, totalTokens: u.total } },
      });
    });

  const evaluatedLengths = new Set();
  const recorder = ({ steps }) => {
    evaluatedLengths.add(steps.length);
    return false;
  };
  const policy = drawn.stopWhen.flatMap(realConditions);
  const stopWhen = [recorder, ...policy.map(({ fn }) => ({ steps }) => fn({ steps: overlay(steps) }))];

  const tools = scriptedTools(drawn.executable, desired);
  let next = 0;
  const steering = drawn.steps.some((step) => step.steer) ? createSteering() : undefined;
  const model = new MockLanguageModelV4({
    doGenerate: async () => {
      const step = script[next++] ?? TERMINAL;
      if (step.steer) void steering.steer('steered');
      return modelResponse(step);
    },
  });
  const agent = new ToolLoopAgent({
    model,
    tools,
    maxRetries: 0,
    stopWhen,
    toolApproval: scriptedApproval(desired),
  });

  const seen = [];
  let error = null;
  try {
    await agent.generate({
      prompt: 'oracle',
      onStepFinish: (step) => void seen.push(step),
      ...(steering ? { experimental_steering: steering } : {}),
    });
  } catch (exc) {
    error = exc; // reported on stderr; the steps seen so far are still the SDK's
  }
  if (error) process.stderr.write(`case ${index}: the SDK rejected: ${error?.name}: ${error?.message}\n`);

  const steps = seen.map((step, i) => {
    const summary = summarizeStep(step, i);
    const u = (script[i] ?? TERMINAL).usage;
    return {
      finish_reason: summary.finish_reason,
      tool_calls: summary.tool_calls,
      usage: { input_tokens: u.input ?? null, output_tokens: u.output ?? null, total_tokens: u.total ?? null },
      steered: Boolean((script[i] ?? TERMINAL).steer),
    };
  });
  const evaluations = [];
  for (let k = 0; k < seen.length; k += 1) {
    const prefix = overlay(seen.slice(0, k + 1));
    const fired = new Set();
    for (const { ids, fn } of policy) {
      if (await fn({ steps: prefix })) ids.forEach((id) => fired.add(id));
    }
    evaluations.push({ step: k, evaluated: evaluatedLengths.has(k + 1), fired: [...fired].sort() });
  }
  return { case: index, stop_when: drawn.stopWhen, steps, evaluations };
}

async function main() {
  const { values } = parseArgs({
    options: { seed: { type: 'string', default: '1' }, cases: { type: 'string', default: '1000' } },
  });
  const seed = Number.parseInt(values.seed, 10);
  const cases = Number.parseInt(values.cases, 10);
  if (!Number.isSafeInteger(seed) || !Number.isSafeInteger(cases) || cases < 0) {
    process.stderr.write('usage: sdk-oracle.mjs --seed S --cases N (integers)\n');
    process.exit(2);
  }
  globalThis.AI_SDK_LOG_WARNINGS = false;
  const lines = [];
  for (let i = 0; i < cases; i += 1) {
    lines.push(JSON.stringify(await runCase(seed, i)));
    if (lines.length >= 500) {
      process.stdout.write(`${lines.join('\n')}\n`);
      lines.length = 0;
    }
  }
  if (lines.length > 0) process.stdout.write(`${lines.join('\n')}\n`);
}

if (process.argv[1] && import.meta.url === pathToFileURL(process.argv[1]).href) {
  await main();
}
