#!/usr/bin/env node
// Bounded recovery end to end, the fleet's side: real ToolLoopAgents (npm `ai`, MockLanguageModelV4, no
// network) of three agents, each a client of its own with its recovery policy, publishing through the
// KafkaSink and carrying out the actions loopwarden's worker publishes (lw.onAction on a
// KafkaActionSource, each resume or restart started with run(newRunId, { recovers: action })).
//
//   invoices  max_attempts 2, STUCK → resume: its first attempt hangs in a tool, the next one finishes
//   hangs     max_attempts 3, STUCK → resume: every attempt hangs in a tool
//   payments  max_attempts 2, FAILED → restart over idempotent_tools [fetch_rates]: one job fails in
//             charge_card (not idempotent), another in fetch_rates (its next attempt finishes)
//   lossy     max_attempts 2, FAILED → restart over every tool it has, UNCERTAIN → escalate: its sink is
//             down while the run takes four steps and fails, so its queue of 3 drops events (reported)
//
// Writes one JSON line per action handled to stdout ({agent, action_id, action, attempt, started}) and
// runs until it is terminated (SIGTERM): the test decides when nothing more comes.
//
// usage: node test/e2e/recovery.mjs --kafka HOST:PORT --steps-topic T --actions-topic T --tag TAG
// Needs `npm run build` first (it imports ../../dist).
import { parseArgs } from 'node:util';
import { ToolLoopAgent, jsonSchema, tool } from 'ai';
import { createLoopwarden, isStepCount, KafkaActionSource, KafkaSink, namedCondition } from '../../dist/index.js';
import { modelStep, scriptedModel } from './scenarios.mjs';

globalThis.AI_SDK_LOG_WARNINGS = false;
const { values } = parseArgs({
  options: {
    kafka: { type: 'string' },
    'steps-topic': { type: 'string' },
    'actions-topic': { type: 'string' },
    tag: { type: 'string' },
  },
});
const brokers = [values.kafka];
const tag = values.tag;
const schema = jsonSchema({ type: 'object', properties: { q: { type: 'string' } } });
// Never answers: the attempt goes silent inside the tool (held by the pending promise, not by a timer).
const hangs = () => tool({ description: 'hangs', inputSchema: schema, execute: () => new Promise(() => {}) });
const works = () => tool({ description: 'works', inputSchema: schema, execute: async () => ({ ok: true }) });
const fails = () =>
  tool({ description: 'fails', inputSchema: schema, execute: async () => Promise.reject(new Error('upstream refused')) });

/** The KafkaSink, refusing every send until opened: the publisher's queue fills and drops (Kafka unreachable). */
class GatedSink {
  constructor(inner) {
    this.inner = inner;
    this.open = false;
  }
  async send(records) {
    if (!this.open) throw new Error('broker unreachable');
    await this.inner.send(records);
  }
  close(timeoutMs) {
    return this.inner.close(timeoutMs);
  }
}

// A short inactivity timeout and no run_active past 0.5 s, so a hung tool is STUCK within ~2 s.
const clients = [];
function client(agent, recovery, { sink = new KafkaSink({ brokers }), ...options } = {}) {
  const lw = createLoopwarden({
    sink,
    actions: new KafkaActionSource({ brokers, topic: values['actions-topic'], groupId: `recovery-${tag}-${agent}` }),
    topics: { steps: values['steps-topic'] },
    agent,
    recovery,
    inactivityTimeoutS: 2,
    runActiveMaxS: 0.5,
    onInternalError: (error) => process.stderr.write(`${agent}: internal error ${error}\n`),
    ...options,
  });
  clients.push(lw);
  return lw;
}

/** An agent calling `toolName` once (`toolImpl` decides what the call does), then answering, in at most `steps` steps. */
function agentWith(toolName, toolImpl, steps = 5) {
  return new ToolLoopAgent({
    model: scriptedModel([modelStep({ calls: [['c1', toolName]] }), modelStep({ text: 'done' })]),
    tools: { [toolName]: toolImpl },
    stopWhen: isStepCount(steps),
  });
}

const invoices = client('invoices', { max_attempts: 2, on: { STUCK: 'resume' } });
const hanging = client('hangs', { max_attempts: 3, on: { STUCK: 'resume' } });
const payments = client('payments', { max_attempts: 2, on: { FAILED: 'restart' }, idempotent_tools: ['fetch_rates'] });
const gate = new GatedSink(new KafkaSink({ brokers }));
const lossy = client(
  'lossy',
  { max_attempts: 2, on: { FAILED: 'restart', UNCERTAIN: 'escalate' }, idempotent_tools: ['search', 'charge_card'] },
  { sink: gate, maxQueue: 3, initialBackoffMs: 50, maxBackoffMs: 200, logger: { warn() {}, error() {} } },
);
const stopOnToolError = namedCondition('stop-on-tool-error', 'bound', ({ steps }) =>
  steps.at(-1).content.some((part) => part.type === 'tool-error'),
);

/** Attempt `n` of job `job` of each agent: what the agent does then. */
const attempts = {
  invoices: (n) => (n === 1 ? agentWith('lookup', hangs()) : agentWith('lookup', works())),
  hangs: () => agentWith('lookup', hangs()),
  payments: (n, job) => {
    if (n > 1) return agentWith('fetch_rates', works());
    // one step: the run stops on the failed call (a failed last step is FAILED)
    return job.startsWith('pay-') ? agentWith('charge_card', fails(), 1) : agentWith('fetch_rates', fails(), 1);
  },
  // three searches, then charge_card fails and the run stops on it: FAILED, were nothing lost
  lossy: () =>
    new ToolLoopAgent({
      model: scriptedModel([
        ...[1, 2, 3].map((i) => modelStep({ calls: [[`s${i}`, 'search']] })),
        modelStep({ calls: [['c1', 'charge_card']] }),
        modelStep({ text: 'never reached' }),
      ]),
      tools: { search: works(), charge_card: fails() },
      stopWhen: [isStepCount(10), stopOnToolError],
    }),
};
const lws = { invoices, hangs: hanging, payments, lossy };

function start(agent, runId, recovers) {
  const attempt = recovers ? recovers.next_attempt : 1;
  const job = recovers ? recovers.job_id : runId;
  const watched = lws[agent].instrument(attempts[agent](attempt, job), { agent });
  // Not awaited: a hung attempt never settles, and the handler must return for the next action.
  return watched
    .run(runId, recovers ? { recovers } : {})
    .generate({ prompt: `job ${job}` })
    .catch((error) => process.stderr.write(`${runId}: ${error}\n`));
}

const subscriptions = Object.entries(lws).map(([agent, lw]) =>
  lw.onAction(async (action) => {
    let started = null;
    if (action.next_attempt !== null) {
      started = `${action.job_id}-a${action.next_attempt}`;
      start(agent, started, action);
    }
    const line = { agent, action_id: action.action_id, action: action.action, attempt: action.attempt, started };
    process.stdout.write(`${JSON.stringify(line)}\n`);
  }),
);
await Promise.all(subscriptions.map((s) => s.ready));

start('invoices', `inv-${tag}`);
start('hangs', `hang-${tag}`);
start('payments', `pay-${tag}`);
start('payments', `rates-${tag}`);
await start('lossy', `lossy-${tag}`);
gate.open = true; // the broker is back: what the queue kept goes out, with the run's events_dropped
process.stdout.write(`${JSON.stringify({ ready: true })}\n`);

process.on('SIGTERM', async () => {
  await Promise.all(subscriptions.map((s) => s.close()));
  await Promise.all(clients.map((lw) => lw.close(5_000)));
  process.exit(0);
});
