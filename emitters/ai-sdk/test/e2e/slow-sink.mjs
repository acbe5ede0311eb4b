#!/usr/bin/env node
// A fleet of real ToolLoopAgents (scripted MockLanguageModelV4) publishing through a sink that
// cannot keep up: every batch takes 20 ms and the queue is small, so events are lost. Writes
//   DIR/events.jsonl  what reached the sink, in delivery order (what `loopwarden replay` reads)
//   DIR/stats.json    the client's stats() after close, and the run ids
// usage: node test/e2e/slow-sink.mjs --out DIR [--runs 200] [--queue 40]
// Used by test/publisher.test.mjs and by loopwarden's tests/e2e/test_ai_sdk_loss.py.
import { mkdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import { ToolLoopAgent, jsonSchema, tool } from 'ai';
import { createLoopwarden, isStepCount, MemorySink } from '../../dist/index.js';
import { modelStep, scriptedModel } from './scenarios.mjs';

/** A MemorySink whose every send takes `delayMs`. */
export class SlowSink extends MemorySink {
  constructor(delayMs = 20) {
    super();
    this.delayMs = delayMs;
  }
  async send(records) {
    await new Promise((resolve) => setTimeout(resolve, this.delayMs));
    await super.send(records);
  }
}

/** Run `runs` agents at once (four steps each) through a slow sink; returns the sink and stats. */
export async function lossyFleet({ runs = 200, maxQueue = 40, maxBatch = 10, delayMs = 20, logger } = {}) {
  const sink = new SlowSink(delayMs);
  const lines = [];
  const lw = createLoopwarden({
    sink,
    agent: 'lossy-agent',
    policyVersion: 'loss-v1',
    maxQueue,
    maxBatch,
    logger: logger ?? { warn: (m) => lines.push(m), error: (m) => lines.push(m) },
  });
  const schema = jsonSchema({ type: 'object', properties: { q: { type: 'string' } } });
  const search = tool({ description: 'search', inputSchema: schema, execute: async () => ({ ok: true }) });
  const ids = Array.from({ length: runs }, (_, i) => `loss-${String(i).padStart(3, '0')}`);
  await Promise.all(
    ids.map(async (id, i) => {
      const agent = new ToolLoopAgent({
        model: scriptedModel([
          modelStep({ calls: [[`${id}-a`, 'search']] }),
          modelStep({ calls: [[`${id}-b`, 'search']] }),
          modelStep({ calls: [[`${id}-c`, 'search']] }),
          modelStep({ text: 'done' }),
        ]),
        tools: { search },
        stopWhen: isStepCount(10),
      });
      await new Promise((resolve) => setTimeout(resolve, i % 17)); // not all in the same tick
      await lw.instrument(agent).run(id).generate({ prompt: 'p' });
    }),
  );
  const stats = await lw.close(60_000);
  return { sink, stats, ids, lines };
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  const { values } = parseArgs({
    options: { out: { type: 'string' }, runs: { type: 'string', default: '200' }, queue: { type: 'string', default: '40' } },
  });
  if (!values.out) {
    process.stderr.write('usage: slow-sink.mjs --out DIR [--runs N] [--queue N]\n');
    process.exit(2);
  }
  const { sink, stats, ids, lines } = await lossyFleet({ runs: Number(values.runs), maxQueue: Number(values.queue) });
  mkdirSync(values.out, { recursive: true });
  writeFileSync(join(values.out, 'events.jsonl'), sink.jsonl());
  writeFileSync(join(values.out, 'stats.json'), `${JSON.stringify({ stats, runs: ids, logLines: lines.length }, null, 1)}\n`);
  process.stdout.write(`${ids.length} runs, ${sink.records.length} events delivered, ${stats.dropped} dropped -> ${values.out}\n`);
}
