// Real ToolLoopAgents (npm `ai`), scripted with MockLanguageModelV4 (no network), instrumented by
// @loopwarden/ai-sdk, driven through every stop of the research note's table
// (the project's research note on AI SDK 7, summarised in docs/decisions.md) and a few more. Used by run-agents.mjs (CLI, for the Python
// e2e test) and by agents.test.mjs (Node test on the emitted events).
//
// Each scenario returns the final health state loopwarden must reach per spec.md section 5, with
// replay `--advance-s 1800` (so every receipt window of 600 s has run out); the reasoning is in the
// comment above each scenario. Every prompt, tool input, tool output and model text contains
// LEAK_MARKER, so a test can prove that none of it reaches the wire.
import * as ai from 'ai';
import { ToolLoopAgent, jsonSchema, tool } from 'ai';
import { MockLanguageModelV4 } from 'ai/test';
import {
  createLoopwarden,
  hasToolCall,
  isStepCount,
  namedCondition,
  tokenBudget,
} from '../../dist/index.js';

export const LEAK_MARKER = 'LEAK-7f3a';
const DAY_MS = 24 * 60 * 60 * 1000;

// --- scripted model -----------------------------------------------------------------------------

function usage(input, output) {
  return {
    inputTokens: { total: input, noCache: undefined, cacheRead: undefined, cacheWrite: undefined },
    outputTokens: { total: output, text: undefined, reasoning: undefined },
  };
}

/** A model step: text and/or tool calls, a unified finish reason, token usage. */
export function modelStep({ text, calls = [], finish, input = 10, output = 5 }) {
  const content = [];
  if (text !== undefined) content.push({ type: 'text', text: `${text} ${LEAK_MARKER}` });
  for (const [toolCallId, toolName, providerExecuted] of calls) {
    if (providerExecuted) {
      // a provider-executed tool: the provider ran it and returned its result in the same response
      content.push({ type: 'tool-call', toolCallId, toolName, input: JSON.stringify({ q: LEAK_MARKER }), providerExecuted: true });
      content.push({ type: 'tool-result', toolCallId, toolName, result: { note: LEAK_MARKER }, providerExecuted: true });
    } else {
      content.push({ type: 'tool-call', toolCallId, toolName, input: JSON.stringify({ q: LEAK_MARKER }) });
    }
  }
  return {
    content,
    finishReason: { unified: finish ?? (calls.length > 0 ? 'tool-calls' : 'stop'), raw: undefined },
    usage: usage(input, output),
    warnings: [],
  };
}

/** A model step that never answers: it waits for the call's abort signal (timeouts, aborts). */
export const HANG = Symbol('hang');

/** A model call that never answers: it rejects with the signal's reason once the call is aborted. */
export function hangUntilAborted(signal) {
  return new Promise((_, reject) => {
    // A real provider's socket keeps the process alive while it waits; the SDK's own
    // total timeout (AbortSignal.timeout) does not, so hold a ref'd timer meanwhile.
    const keepAlive = setTimeout(() => reject(new Error('scripted model hung for 30 s')), 30_000);
    const stop = () => {
      clearTimeout(keepAlive);
      reject(signal.reason);
    };
    if (signal?.aborted) stop();
    signal?.addEventListener('abort', stop, { once: true });
  });
}

/** MockLanguageModelV4 that plays `steps` in order, across calls (a resume continues the script). */
export function scriptedModel(steps) {
  let next = 0;
  return new MockLanguageModelV4({
    doGenerate: async (options) => {
      const step = steps[next];
      next += 1;
      if (step === HANG || step === undefined) return await hangUntilAborted(options.abortSignal);
      return step;
    },
  });
}

const schema = jsonSchema({ type: 'object', properties: { q: { type: 'string' } } });
const ok = () => async () => ({ ok: true, note: LEAK_MARKER });
const tools = {
  search: () => tool({ description: 'search', inputSchema: schema, execute: ok() }),
  write: () => tool({ description: 'write a record', inputSchema: schema, execute: ok() }),
  // done without execute: the loop stops with the call unexecuted (an explicit done signal)
  doneSignal: () => tool({ description: 'signal completion', inputSchema: schema }),
  done: () => tool({ description: 'finish', inputSchema: schema, execute: ok() }),
  failing: () =>
    tool({
      description: 'always fails',
      inputSchema: schema,
      execute: async () => {
        throw new Error(`upstream refused ${LEAK_MARKER}`);
      },
    }),
  deploy: () => tool({ description: 'deploy', inputSchema: schema, execute: ok() }),
  // a tool that takes 2 s unless the call's signal aborts it (then it rejects with the reason, as
  // fetch does); `started` is called once it runs
  slow: (started) =>
    tool({
      description: 'slow',
      inputSchema: schema,
      execute: (_input, { abortSignal }) =>
        new Promise((resolve, reject) => {
          const timer = setTimeout(() => resolve({ ok: true, note: LEAK_MARKER }), 2000);
          abortSignal?.addEventListener('abort', () => {
            clearTimeout(timer);
            reject(abortSignal.reason);
          }, { once: true });
          started?.();
        }),
    }),
};

function receipt(lw, runId, verified, extra = {}) {
  lw.publishReceipt({
    runId,
    receiptId: `${runId}/r1`,
    kind: 'record',
    verifier: 'destination',
    verified,
    evidence: { key: `invoices/${runId}`, sha256: '9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08', size: 512 },
    ...extra,
  });
}

const userPrompt = (what) => [{ role: 'user', content: `${what} ${LEAK_MARKER}` }];

// --- scenarios ------------------------------------------------------------------------------------
// Each: async (lw, id) => expected final state. `id` is the run id.

export const SCENARIOS = {
  // Text-only last step, finish `stop` → natural_finish (completion). The destination then
  // publishes a verified receipt → VERIFIED_COMPLETE.
  async 'natural-verified'(lw, id) {
    const agent = new ToolLoopAgent({
      model: scriptedModel([modelStep({ calls: [['c1', 'search']] }), modelStep({ text: 'all done' })]),
      tools: { search: tools.search() },
      stopWhen: [isStepCount(10), hasToolCall('done')],
    });
    await lw.instrument(agent).run(id).generate({ prompt: `invoice ${LEAK_MARKER}` });
    receipt(lw, id, true);
    return 'VERIFIED_COMPLETE';
  },

  // Natural finish and no receipt ever: VERIFYING until receipt_window_s (600 s) after run_ended,
  // then FALSE_COMPLETE (receipt_window_expired) — the agent said done, nothing proves it.
  async 'natural-no-receipt'(lw, id) {
    const agent = new ToolLoopAgent({
      model: scriptedModel([modelStep({ text: 'I have created the invoice' })]),
      tools: { search: tools.search() },
      stopWhen: [isStepCount(10)],
    });
    await lw.instrument(agent).run(id).generate({ prompt: `invoice ${LEAK_MARKER}` });
    return 'FALSE_COMPLETE';
  },

  // `done` has no execute: the call stays pending and the loop stops → unexecuted_tool
  // (completion). Verified receipt → VERIFIED_COMPLETE.
  async 'done-without-execute-verified'(lw, id) {
    const agent = new ToolLoopAgent({
      model: scriptedModel([modelStep({ calls: [['c1', 'write']] }), modelStep({ calls: [['c2', 'done']] })]),
      tools: { write: tools.write(), done: tools.doneSignal() },
      stopWhen: [isStepCount(10)],
    });
    await lw.instrument(agent).run(id).generate({ prompt: `invoice ${LEAK_MARKER}` });
    receipt(lw, id, true);
    return 'VERIFIED_COMPLETE';
  },

  // hasToolCall('done') with an executing `done` → stop_condition, fired [tool_call:done], only a
  // completion condition. The destination checked and found nothing (verified: false) →
  // FALSE_COMPLETE (negative_receipt).
  async 'done-with-execute-negative'(lw, id) {
    const agent = new ToolLoopAgent({
      model: scriptedModel([modelStep({ calls: [['c1', 'write']] }), modelStep({ calls: [['c2', 'done']] })]),
      tools: { write: tools.write(), done: tools.done() },
      stopWhen: [isStepCount(10), hasToolCall('done')],
    });
    await lw.instrument(agent).run(id).generate({ prompt: `invoice ${LEAK_MARKER}` });
    receipt(lw, id, false);
    return 'FALSE_COMPLETE';
  },

  // Same stop, but the destination's receipt arrives *during* the run (the write tool's side
  // effect is confirmed at once): held, and used at run_ended → VERIFIED_COMPLETE directly.
  async 'done-with-execute-receipt-first'(lw, id) {
    const agent = new ToolLoopAgent({
      model: scriptedModel([modelStep({ calls: [['c1', 'write']] }), modelStep({ calls: [['c2', 'done']] })]),
      tools: {
        write: tool({
          inputSchema: schema,
          execute: async () => {
            receipt(lw, id, true);
            return { ok: true };
          },
        }),
        done: tools.done(),
      },
      stopWhen: [isStepCount(10), hasToolCall('done')],
    });
    await lw.instrument(agent).run(id).generate({ prompt: `invoice ${LEAK_MARKER}` });
    return 'VERIFIED_COMPLETE';
  },

  // isStepCount(3) fires at the 3rd step (all earlier evaluations false) → stop_condition with a
  // bound fired → BOUNDED_STOP, whatever receipts say (a verified one is sent to show it).
  async 'step-cap'(lw, id) {
    const agent = new ToolLoopAgent({
      model: scriptedModel([1, 2, 3, 4].map((i) => modelStep({ calls: [[`c${i}`, 'search']] }))),
      tools: { search: tools.search(), done: tools.done() },
      stopWhen: [isStepCount(3), hasToolCall('done')],
    });
    await lw.instrument(agent).run(id).generate({ prompt: `invoice ${LEAK_MARKER}` });
    receipt(lw, id, true);
    return 'BOUNDED_STOP';
  },

  // No stopWhen: the ToolLoopAgent default cap, isStepCount(20), stops at the 20th step. Policy
  // stop_when null = [step_count 20]; fired [step_count:20] → BOUNDED_STOP.
  async 'default-step-cap'(lw, id) {
    const agent = new ToolLoopAgent({
      model: scriptedModel(Array.from({ length: 25 }, (_, i) => modelStep({ calls: [[`c${i}`, 'search']] }))),
      tools: { search: tools.search() },
    });
    const previous = globalThis.AI_SDK_LOG_WARNINGS;
    globalThis.AI_SDK_LOG_WARNINGS = false; // the SDK's default-cap warning would clutter output
    try {
      await lw.instrument(agent).run(id).generate({ prompt: `invoice ${LEAK_MARKER}` });
    } finally {
      globalThis.AI_SDK_LOG_WARNINGS = previous;
    }
    return 'BOUNDED_STOP';
  },

  // tokenBudget(50): 20 tokens per step, so the sum reaches 60 ≥ 50 after the 3rd step → fired
  // [token_budget:50], a bound → BOUNDED_STOP.
  async 'token-budget'(lw, id) {
    const agent = new ToolLoopAgent({
      model: scriptedModel([1, 2, 3, 4, 5].map((i) => modelStep({ calls: [[`c${i}`, 'search']], input: 12, output: 8 }))),
      tools: { search: tools.search() },
      stopWhen: [isStepCount(20), tokenBudget(50)],
    });
    await lw.instrument(agent).run(id).generate({ prompt: `invoice ${LEAK_MARKER}` });
    return 'BOUNDED_STOP';
  },

  // The tool throws; a custom "stop on tool error" condition (named, role bound) fires on that
  // step → the boundary reports tool_error with fired [custom:stop-on-tool-error]; a tool call of
  // L has status error → FAILED (precedence 1).
  async 'tool-error-stop'(lw, id) {
    const stopOnToolError = namedCondition('stop-on-tool-error', 'bound', ({ steps }) =>
      steps.at(-1).content.some((part) => part.type === 'tool-error'),
    );
    const agent = new ToolLoopAgent({
      model: scriptedModel([modelStep({ calls: [['c1', 'failing']] }), modelStep({ text: 'sorry' })]),
      tools: { failing: tools.failing() },
      stopWhen: [isStepCount(10), stopOnToolError],
    });
    await lw.instrument(agent).run(id).generate({ prompt: `invoice ${LEAK_MARKER}` });
    return 'FAILED';
  },

  // The tool throws, the model sees the error and finishes with text: the error is in an earlier
  // step only (counted in evidence.tool_errors), L is natural_finish → with a verified receipt
  // VERIFIED_COMPLETE.
  async 'tool-error-recovered'(lw, id) {
    const agent = new ToolLoopAgent({
      model: scriptedModel([modelStep({ calls: [['c1', 'failing']] }), modelStep({ calls: [['c2', 'write']] }), modelStep({ text: 'done' })]),
      tools: { failing: tools.failing(), write: tools.write() },
      stopWhen: [isStepCount(10)],
    });
    await lw.instrument(agent).run(id).generate({ prompt: `invoice ${LEAK_MARKER}` });
    receipt(lw, id, true);
    return 'VERIFIED_COMPLETE';
  },

  // `deploy` needs user approval; the application routes it (owner, deadline in 24 h, resume
  // token) → approval_required with a routed approval → WAITING; the deadline is far beyond the
  // replay's +1800 s, so it stays WAITING.
  async 'approval-routed'(lw, id) {
    const agent = new ToolLoopAgent({
      model: scriptedModel([modelStep({ calls: [['c1', 'deploy']] })]),
      tools: { deploy: tools.deploy() },
      toolApproval: { deploy: 'user-approval' },
      stopWhen: [isStepCount(10)],
    });
    await lw
      .instrument(agent, {
        routeApproval: ({ approvalId }) => ({ owner: 'ops-oncall', deadlineTs: Date.now() + DAY_MS, resumeToken: `resume-${approvalId}` }),
      })
      .run(id)
      .generate({ prompt: `deploy ${LEAK_MARKER}` });
    return 'WAITING';
  },

  // Same approval, nobody routes it → WAITING_UNROUTED (the alert; it never times out).
  async 'approval-unrouted'(lw, id) {
    const agent = new ToolLoopAgent({
      model: scriptedModel([modelStep({ calls: [['c1', 'deploy']] })]),
      tools: { deploy: tools.deploy() },
      toolApproval: { deploy: 'user-approval' },
      stopWhen: [isStepCount(10)],
    });
    await lw.instrument(agent).run(id).generate({ prompt: `deploy ${LEAK_MARKER}` });
    return 'WAITING_UNROUTED';
  },

  // Unrouted at first, routed later with all three fields (approval_routed) → WAITING.
  async 'approval-routed-later'(lw, id) {
    const agent = new ToolLoopAgent({
      model: scriptedModel([modelStep({ calls: [['c1', 'deploy']] })]),
      tools: { deploy: tools.deploy() },
      toolApproval: { deploy: 'user-approval' },
      stopWhen: [isStepCount(10)],
    });
    const run = lw.instrument(agent).run(id);
    const result = await run.generate({ prompt: `deploy ${LEAK_MARKER}` });
    const request = result.steps.at(-1).content.find((p) => p.type === 'tool-approval-request');
    run.approvalRouted(request.approvalId, { owner: 'ops-oncall', deadlineTs: Date.now() + DAY_MS, resumeToken: 'later' });
    return 'WAITING';
  },

  // Approval requested (segment 0, routed → WAITING), approved, resumed with the approval response
  // (approval_resolved → RUNNING), segment 1: the SDK runs the approved tool, the model finishes
  // with text → natural_finish; verified receipt → VERIFIED_COMPLETE. Two segments.
  async 'approval-resumed'(lw, id) {
    const agent = new ToolLoopAgent({
      model: scriptedModel([modelStep({ calls: [['c1', 'deploy']] }), modelStep({ text: 'deployed' })]),
      tools: { deploy: tools.deploy() },
      toolApproval: { deploy: 'user-approval' },
      stopWhen: [isStepCount(10)],
    });
    const run = lw
      .instrument(agent, {
        routeApproval: ({ approvalId }) => ({ owner: 'ops-oncall', deadlineTs: Date.now() + DAY_MS, resumeToken: `resume-${approvalId}` }),
      })
      .run(id);
    const messages = userPrompt('deploy');
    const first = await run.generate({ messages });
    const request = first.steps.at(-1).content.find((p) => p.type === 'tool-approval-request');
    await run.generate({
      messages: [
        ...messages,
        ...first.response.messages,
        { role: 'tool', content: [{ type: 'tool-approval-response', approvalId: request.approvalId, approved: true }] },
      ],
    });
    receipt(lw, id, true, { kind: 'deployment' });
    return 'VERIFIED_COMPLETE';
  },

  // Approval denied on resume: the denial is handed to the model, which answers with text →
  // natural_finish in segment 1; nothing was deployed and no receipt comes → FALSE_COMPLETE
  // after the receipt window.
  async 'approval-denied'(lw, id) {
    const agent = new ToolLoopAgent({
      model: scriptedModel([modelStep({ calls: [['c1', 'deploy']] }), modelStep({ text: 'not deployed' })]),
      tools: { deploy: tools.deploy() },
      toolApproval: { deploy: 'user-approval' },
      stopWhen: [isStepCount(10)],
    });
    const run = lw.instrument(agent).run(id);
    const messages = userPrompt('deploy');
    const first = await run.generate({ messages });
    const request = first.steps.at(-1).content.find((p) => p.type === 'tool-approval-request');
    await run.generate({
      messages: [
        ...messages,
        ...first.response.messages,
        { role: 'tool', content: [{ type: 'tool-approval-response', approvalId: request.approvalId, approved: false }] },
      ],
    });
    return 'FALSE_COMPLETE';
  },

  // The user aborts after the first step (between steps): generate() rejects with AbortError,
  // run_ended cause aborted → BOUNDED_STOP (precedence 5).
  async abort(lw, id) {
    const controller = new AbortController();
    const agent = new ToolLoopAgent({
      model: scriptedModel([modelStep({ calls: [['c1', 'search']] }), modelStep({ calls: [['c2', 'search']] }), modelStep({ text: 'x' })]),
      tools: { search: tools.search() },
      stopWhen: [isStepCount(10)],
    });
    await lw
      .instrument(agent)
      .run(id)
      .generate({ prompt: `invoice ${LEAK_MARKER}`, abortSignal: controller.signal, onStepFinish: () => controller.abort() })
      .catch((error) => assertName(error, 'AbortError'));
    return 'BOUNDED_STOP';
  },

  // timeout.totalMs: the second model call hangs, the call rejects with TimeoutError → cause
  // timeout → STUCK (precedence 3).
  async 'timeout-total'(lw, id) {
    const agent = new ToolLoopAgent({
      model: scriptedModel([modelStep({ calls: [['c1', 'search']] }), HANG]),
      tools: { search: tools.search() },
      stopWhen: [isStepCount(10)],
    });
    await lw
      .instrument(agent)
      .run(id)
      .generate({ prompt: `invoice ${LEAK_MARKER}`, timeout: { totalMs: 150 } })
      .catch((error) => assertName(error, 'TimeoutError'));
    return 'STUCK';
  },

  // timeout.stepMs: the first model call hangs → TimeoutError with no step at all → STUCK.
  async 'timeout-step'(lw, id) {
    const agent = new ToolLoopAgent({
      model: scriptedModel([HANG]),
      tools: { search: tools.search() },
      stopWhen: [isStepCount(10)],
      timeout: { stepMs: 100 },
    });
    await lw
      .instrument(agent)
      .run(id)
      .generate({ prompt: `invoice ${LEAK_MARKER}` })
      .catch((error) => assertName(error, 'TimeoutError'));
    return 'STUCK';
  },

  // agent.stream(): same instrumentation; the run ends when the stream has been consumed.
  // Natural finish + verified receipt → VERIFIED_COMPLETE.
  async 'stream-natural'(lw, id) {
    const agent = new ToolLoopAgent({
      model: streamingModel([{ calls: [['c1', 'search']] }, { text: 'streamed' }]),
      tools: { search: tools.search() },
      stopWhen: [isStepCount(10)],
    });
    const result = await lw.instrument(agent).run(id).stream({ prompt: `invoice ${LEAK_MARKER}` });
    await result.consumeStream();
    await result.steps;
    receipt(lw, id, true);
    return 'VERIFIED_COMPLETE';
  },

  // Experimental steering (ai >= 7.0.154): a steering message arrives while the first, text-only
  // step is generated. The SDK then evaluates stopWhen after that step (it would not without
  // steering), isStepCount(1) fires and the run stops there: stop_condition, a bound →
  // BOUNDED_STOP (the emitter marks run_ended `steered` so the evaluator knows; before, this came
  // out UNCERTAIN: cause_mismatch, fired_mismatch). An `ai` without steering ignores the option:
  // the step ends the run naturally and, with no receipt, FALSE_COMPLETE.
  async 'steered-step-cap'(lw, id) {
    const createSteering = ai.experimental_createSteering;
    const steering = typeof createSteering === 'function' ? createSteering() : undefined;
    const step = modelStep({ text: 'checking the invoice' });
    const model = new MockLanguageModelV4({
      doGenerate: async () => {
        void steering?.steer(`also check the VAT number ${LEAK_MARKER}`);
        return step;
      },
    });
    const agent = new ToolLoopAgent({ model, tools: { search: tools.search() }, stopWhen: isStepCount(1) });
    await lw.instrument(agent).run(id).generate({ prompt: `invoice ${LEAK_MARKER}`, experimental_steering: steering });
    return steering ? 'BOUNDED_STOP' : 'FALSE_COMPLETE';
  },

  // Plain generateText (no agent) with hasToolCall('done'): its `done` executes → stop_condition
  // tool_call:done (completion); a validator finds the output wrong → FALSE_COMPLETE.
  async 'generate-text-done'(lw, id) {
    const run = lw.run(id, { agent: 'text-agent' });
    await run.generateText({
      model: scriptedModel([modelStep({ calls: [['c1', 'write']] }), modelStep({ calls: [['c2', 'done']] })]),
      tools: { write: tools.write(), done: tools.done() },
      stopWhen: [isStepCount(5), hasToolCall('done')],
      prompt: `summarise ${LEAK_MARKER}`,
    });
    lw.publishReceipt({ runId: id, receiptId: `${id}/v1`, kind: 'analysis', verifier: 'validator', verified: false });
    return 'FALSE_COMPLETE';
  },

  // --- producer fidelity II: provider errors, aborts inside tools, provider tools, ---
  // --- streams nobody reads --------------------------------------------------------------------

  // streamText whose second step carries an `error` part ("overloaded") and then finishes: the
  // call does not reject, the SDK only logs it. A provider failure → error → FAILED.
  async 'stream-provider-error'(lw, id) {
    const result = lw.run(id, { agent: 'text-agent' }).streamText({
      model: streamingModel([{ calls: [['c1', 'search']] }, { text: 'partial', error: 'overloaded' }]),
      tools: { search: tools.search() },
      stopWhen: isStepCount(5),
      onError: () => {},
      prompt: `invoice ${LEAK_MARKER}`,
    });
    await result.consumeStream();
    return 'FAILED';
  },

  // agent.stream, the same error part in its only step → FAILED.
  async 'agent-stream-provider-error'(lw, id) {
    const agent = new ToolLoopAgent({
      model: streamingModel([{ text: 'partial', error: 'overloaded' }]),
      tools: { search: tools.search() },
      onError: () => {},
    });
    const result = await lw.instrument(agent).run(id).stream({ prompt: `invoice ${LEAK_MARKER}` });
    await result.consumeStream();
    return 'FAILED';
  },

  // doStream throws at the second step: the stream ends with an error part, nothing rejects → FAILED.
  async 'stream-throws-later'(lw, id) {
    const result = lw.run(id, { agent: 'text-agent' }).streamText({
      model: streamingModel([{ calls: [['c1', 'search']] }, { throws: 'overloaded' }]),
      tools: { search: tools.search() },
      stopWhen: isStepCount(5),
      maxRetries: 0,
      onError: () => {},
      prompt: `invoice ${LEAK_MARKER}`,
    });
    await result.consumeStream();
    return 'FAILED';
  },

  // The caller aborts while a tool runs; the SDK turns the abort into a tool-error part, evaluates
  // hasToolCall('slow') after it, and resolves. The call is `cancelled`, the cause aborted: a
  // bounded stop, never FAILED (tool_error) and never a completion.
  async 'abort-in-tool'(lw, id) {
    const controller = new AbortController();
    const agent = new ToolLoopAgent({
      model: scriptedModel([modelStep({ calls: [['c1', 'slow']] }), modelStep({ text: 'after' })]),
      tools: { slow: tools.slow(() => controller.abort()) },
      stopWhen: [isStepCount(5), hasToolCall('slow')],
    });
    await lw.instrument(agent).run(id).generate({ prompt: `invoice ${LEAK_MARKER}`, abortSignal: controller.signal });
    return 'BOUNDED_STOP';
  },

  // The call's total timeout fires while a tool runs: the call is `cancelled`, the cause timeout → STUCK.
  async 'timeout-in-tool'(lw, id) {
    const agent = new ToolLoopAgent({
      model: scriptedModel([modelStep({ calls: [['c1', 'slow']] }), modelStep({ text: 'after' })]),
      tools: { slow: tools.slow() },
      stopWhen: isStepCount(5),
    });
    const error = await lw.instrument(agent).run(id).generate({ prompt: `invoice ${LEAK_MARKER}`, timeout: { totalMs: 150 } }).catch((e) => e);
    assertName(error, 'TimeoutError');
    return 'STUCK';
  },

  // The same timeout on the streaming path → STUCK as well.
  async 'stream-timeout-in-tool'(lw, id) {
    const agent = new ToolLoopAgent({
      model: streamingModel([{ calls: [['c1', 'slow']] }, { text: 'after' }]),
      tools: { slow: tools.slow() },
      stopWhen: isStepCount(5),
    });
    const result = await lw.instrument(agent).run(id).stream({ prompt: `invoice ${LEAK_MARKER}`, timeout: { totalMs: 150 } });
    await result.consumeStream({ onError: () => {} });
    return 'STUCK';
  },

  // A provider-executed tool (web search) beside a client tool: published with its flag, and the
  // SDK's hasToolCall('web_search') fires on it → stop_condition (completion); verified → complete.
  async 'provider-executed-tool'(lw, id) {
    const agent = new ToolLoopAgent({
      model: scriptedModel([
        modelStep({ calls: [['c1', 'search'], ['p1', 'web_search', true]] }),
        modelStep({ text: 'never reached' }),
      ]),
      tools: { search: tools.search() },
      stopWhen: [isStepCount(5), hasToolCall('web_search')],
    });
    await lw.instrument(agent).run(id).generate({ prompt: `invoice ${LEAK_MARKER}` });
    receipt(lw, id, true);
    return 'VERIFIED_COMPLETE';
  },

  // The consumer reads one part of agent.stream() and stops (`break`): the run is cancelled →
  // aborted (StreamCancelled) → BOUNDED_STOP, instead of a run that never ends (STUCK).
  async 'stream-consumer-stops'(lw, id) {
    const agent = new ToolLoopAgent({
      model: streamingModel([{ calls: [['c1', 'search']] }, { text: 'after' }]),
      tools: { search: tools.search() },
      stopWhen: isStepCount(5),
    });
    const result = await lw.instrument(agent).run(id).stream({ prompt: `invoice ${LEAK_MARKER}` });
    for await (const part of result.fullStream) {
      if (part) break;
    }
    return 'BOUNDED_STOP';
  },

  // --- segments under their own policy, resumes on a fresh handle, long tools ------------------

  // generateText resumed after an approval *without* stopWhen runs under the SDK's one-step
  // default, not the run's [isStepCount(10), hasToolCall('done')]: segment_started says so, and the
  // resume's isStepCount(1) stop is a bound → BOUNDED_STOP (it was UNCERTAIN: the run's policy
  // could not explain it).
  async 'resume-without-stopwhen'(lw, id) {
    const run = lw.run(id, { agent: 'text-agent' });
    const model = scriptedModel([modelStep({ calls: [['c1', 'deploy']] }), modelStep({ calls: [['c2', 'search']] }), modelStep({ text: 'done' })]);
    const common = { model, tools: { deploy: tools.deploy(), search: tools.search() }, toolApproval: { deploy: 'user-approval' } };
    const messages = userPrompt('deploy');
    const first = await run.generateText({ ...common, stopWhen: [isStepCount(10), hasToolCall('done')], messages });
    const request = first.steps.at(-1).content.find((p) => p.type === 'tool-approval-request');
    await run.generateText({
      ...common,
      messages: [
        ...messages,
        ...first.response.messages,
        { role: 'tool', content: [{ type: 'tool-approval-response', approvalId: request.approvalId, approved: true }] },
      ],
    });
    return 'BOUNDED_STOP';
  },

  // The resume goes through a *new* handle of the same client (e.g. the request that resumes is
  // another request): it continues the run's segment numbering (segment 1), so the resumed
  // segment counts → natural finish, verified → VERIFIED_COMPLETE (it was STUCK: a duplicate).
  async 'fresh-handle-resume'(lw, id) {
    const agent = new ToolLoopAgent({
      model: scriptedModel([modelStep({ calls: [['c1', 'deploy']] }), modelStep({ text: 'deployed' })]),
      tools: { deploy: tools.deploy() },
      toolApproval: { deploy: 'user-approval' },
      stopWhen: [isStepCount(10)],
    });
    const watched = lw.instrument(agent);
    const messages = userPrompt('deploy');
    const first = await watched.run(id).generate({ messages });
    const request = first.steps.at(-1).content.find((p) => p.type === 'tool-approval-request');
    await watched.run(id).generate({
      messages: [
        ...messages,
        ...first.response.messages,
        { role: 'tool', content: [{ type: 'tool-approval-response', approvalId: request.approvalId, approved: true }] },
      ],
    });
    receipt(lw, id, true, { kind: 'deployment' });
    return 'VERIFIED_COMPLETE';
  },

  // A tool that runs 1 s under an inactivity timeout of 0.3 s: run_active keeps the run from
  // passing through STUCK (checked on the path by the e2e test) → natural finish, verified.
  async 'long-tool-run-active'(lw, id) {
    const agent = new ToolLoopAgent({
      model: scriptedModel([modelStep({ calls: [['c1', 'lengthy']] }), modelStep({ text: 'done' })]),
      tools: {
        lengthy: tool({
          description: 'takes a while',
          inputSchema: schema,
          execute: () => new Promise((resolve) => setTimeout(() => resolve({ ok: true, note: LEAK_MARKER }), 1000)),
        }),
      },
      stopWhen: isStepCount(5),
    });
    await lw.instrument(agent, { inactivityTimeoutS: 0.3 }).run(id).generate({ prompt: `invoice ${LEAK_MARKER}` });
    receipt(lw, id, true);
    return 'VERIFIED_COMPLETE';
  },

  // The agent's prepareCall swaps stopWhen for this call (SDK's own isStepCount(1) instead of the
  // agent's isStepCount(10)): segment_started carries the policy that ran, and its step cap is a
  // bound → BOUNDED_STOP (it was UNCERTAIN: the agent's policy could not explain the stop).
  async 'prepare-call-swaps-stopwhen'(lw, id) {
    const agent = new ToolLoopAgent({
      model: scriptedModel([modelStep({ calls: [['c1', 'search']] }), modelStep({ text: 'never reached' })]),
      tools: { search: tools.search() },
      stopWhen: isStepCount(10),
      prepareCall: (args) => ({ ...args, stopWhen: ai.isStepCount(1) }),
    });
    await lw.instrument(agent).run(id).generate({ prompt: `invoice ${LEAK_MARKER}` });
    return 'BOUNDED_STOP';
  },

  // A model call of 1 s under the same 0.3 s timeout: run_active `in: model` → never STUCK.
  async 'long-model-call-run-active'(lw, id) {
    const script = scriptedModel([modelStep({ text: 'done' })]);
    const model = new MockLanguageModelV4({
      doGenerate: async (options) => {
        await new Promise((resolve) => setTimeout(resolve, 1000));
        return script.doGenerate(options);
      },
    });
    const agent = new ToolLoopAgent({ model, stopWhen: isStepCount(5) });
    await lw.instrument(agent, { inactivityTimeoutS: 0.3 }).run(id).generate({ prompt: `invoice ${LEAK_MARKER}` });
    receipt(lw, id, true);
    return 'VERIFIED_COMPLETE';
  },
};

function assertName(error, name) {
  if (error?.name !== name) throw new Error(`expected a ${name}, got ${error?.name}: ${error?.message}`);
}

/** A streaming mock: each call streams one step (text and/or tool calls) and finishes. */
function streamingModel(steps) {
  let next = 0;
  return new MockLanguageModelV4({
    doStream: async () => {
      const spec = steps[next];
      next += 1;
      if (spec.throws) throw Object.assign(new Error(`${spec.throws} ${LEAK_MARKER}`), { name: 'AI_APICallError' });
      const parts = [{ type: 'stream-start', warnings: [] }];
      if (spec.text !== undefined) {
        parts.push({ type: 'text-start', id: 't' }, { type: 'text-delta', id: 't', delta: `${spec.text} ${LEAK_MARKER}` }, { type: 'text-end', id: 't' });
      }
      for (const [toolCallId, toolName] of spec.calls ?? []) {
        parts.push({ type: 'tool-call', toolCallId, toolName, input: JSON.stringify({ q: LEAK_MARKER }) });
      }
      if (spec.error) parts.push({ type: 'error', error: new Error(`${spec.error} ${LEAK_MARKER}`) });
      parts.push({
        type: 'finish',
        finishReason: { unified: spec.calls ? 'tool-calls' : 'stop', raw: undefined },
        usage: usage(10, 5),
      });
      return {
        stream: new ReadableStream({
          start(controller) {
            for (const part of parts) controller.enqueue(part);
            controller.close();
          },
        }),
      };
    },
  });
}

/**
 * Run the scenarios (all, or those named) one after another with one Loopwarden client on `sink`.
 * Returns { expected: {run_id: state}, stats }.
 */
export async function runScenarios({ sink, prefix = 'ai-', only, topics } = {}) {
  const lw = createLoopwarden({ sink, agent: 'e2e-agent', policyVersion: 'e2e-v1', topics });
  const expected = {};
  for (const [name, scenario] of Object.entries(SCENARIOS)) {
    if (only && !only.includes(name)) continue;
    const id = `${prefix}${name}`;
    expected[id] = await scenario(lw, id);
  }
  const stats = await lw.close(30_000);
  return { expected, stats };
}

