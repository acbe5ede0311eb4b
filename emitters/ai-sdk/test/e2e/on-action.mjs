#!/usr/bin/env node
// Carry out recovery actions read from Kafka: lw.onAction on a KafkaActionSource, and for each resume
// or restart a next attempt (a generateText run on the mock model, no network) published through the
// KafkaSink with run(newRunId, { recovers }). Writes one JSON line per action handled to stdout
// ({action_id, action, at, started}) and exits after --expect of them (and a second more, so that a
// repeat would show).
//
// usage: node test/e2e/on-action.mjs --kafka HOST:PORT --actions-topic T --steps-topic T --group G --expect N
// Needs `npm run build` first (it imports ../../dist).
import { parseArgs } from 'node:util';
import { createLoopwarden, isStepCount, KafkaActionSource, KafkaSink } from '../../dist/index.js';
import { modelStep, scriptedModel } from './scenarios.mjs';

globalThis.AI_SDK_LOG_WARNINGS = false;
const { values } = parseArgs({
  options: {
    kafka: { type: 'string' },
    'actions-topic': { type: 'string' },
    'steps-topic': { type: 'string' },
    group: { type: 'string' },
    expect: { type: 'string' },
  },
});
const brokers = [values.kafka];
const lw = createLoopwarden({
  sink: new KafkaSink({ brokers }),
  actions: new KafkaActionSource({ brokers, topic: values['actions-topic'], groupId: values.group }),
  topics: { steps: values['steps-topic'] },
  agent: 'invoices',
  recovery: { max_attempts: 3, on: { STUCK: 'resume' } },
});

const expect = Number(values.expect);
let handled = 0;
let done;
const finished = new Promise((resolve) => (done = resolve));
const subscription = lw.onAction(async (action) => {
  let started = null;
  if (action.next_attempt !== null) {
    const run = lw.run(`${action.job_id}-a${action.next_attempt}`, { recovers: action });
    await run.generateText({ model: scriptedModel([modelStep({ text: 'done' })]), prompt: 'again', stopWhen: isStepCount(4) });
    started = run.runId;
  }
  process.stdout.write(`${JSON.stringify({ action_id: action.action_id, action: action.action, at: Date.now(), started })}\n`);
  handled += 1;
  if (handled >= expect) setTimeout(done, 1_000);
});
const timeout = setTimeout(() => {
  process.stderr.write(`timed out with ${handled} of ${expect} actions handled\n`);
  process.exit(1);
}, 120_000);
await finished;
clearTimeout(timeout);
await subscription.close();
const stats = await lw.close();
process.stderr.write(`${JSON.stringify({ actions: subscription.stats(), publisher: stats })}\n`);
