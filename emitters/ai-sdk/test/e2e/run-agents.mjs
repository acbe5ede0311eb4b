#!/usr/bin/env node
// Run real ToolLoopAgents (scripted MockLanguageModelV4, no network) instrumented by
// @loopwarden/ai-sdk through every stop case (see scenarios.mjs for the cases and why each ends
// in its state), and write:
//   DIR/events.jsonl   every event, in publish order (what `loopwarden replay` reads)
//   DIR/expected.json  {run_id: final health state after replay --advance-s 1800}
//
// usage: node test/e2e/run-agents.mjs --out DIR [--kafka HOST:PORT --steps-topic T --outcomes-topic T]
//        [--prefix P] [--only name,name]
// With --kafka the events go to Kafka (KafkaSink, keyed by run id) and are also written to
// events.jsonl. Needs `npm run build` first (it imports ../../dist).
import { mkdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { KafkaSink, MemorySink } from '../../dist/index.js';
import { runScenarios } from './scenarios.mjs';

const { values } = parseArgs({
  options: {
    out: { type: 'string' },
    kafka: { type: 'string' },
    'steps-topic': { type: 'string', default: 'agent.steps' },
    'outcomes-topic': { type: 'string', default: 'agent.outcomes' },
    prefix: { type: 'string', default: 'ai-' },
    only: { type: 'string' },
  },
});
if (!values.out) {
  process.stderr.write('usage: run-agents.mjs --out DIR [--kafka HOST:PORT --steps-topic T --outcomes-topic T]\n');
  process.exit(2);
}

/** Sends to every sink; the memory copy gives events.jsonl in publish order. */
class TeeSink {
  constructor(...sinks) {
    this.sinks = sinks;
  }
  async send(records) {
    for (const sink of this.sinks) await sink.send(records);
  }
  async close() {
    for (const sink of this.sinks) await sink.close();
  }
}

const memory = new MemorySink();
const sink = values.kafka ? new TeeSink(new KafkaSink({ brokers: values.kafka.split(',') }), memory) : memory;
const { expected, stats } = await runScenarios({
  sink,
  prefix: values.prefix,
  only: values.only?.split(','),
  topics: { steps: values['steps-topic'], outcomes: values['outcomes-topic'] },
});
if (stats.dropped > 0 || stats.pending > 0 || stats.internalErrors > 0) {
  process.stderr.write(`not every event was delivered: ${JSON.stringify(stats)}\n`);
  process.exit(1);
}
mkdirSync(values.out, { recursive: true });
writeFileSync(join(values.out, 'events.jsonl'), memory.jsonl());
writeFileSync(join(values.out, 'expected.json'), `${JSON.stringify(expected, null, 1)}\n`);
process.stdout.write(`${Object.keys(expected).length} runs, ${memory.records.length} events -> ${values.out}\n`);
