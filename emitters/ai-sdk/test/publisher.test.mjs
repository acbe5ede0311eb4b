// The queue in front of Kafka: never blocks, never throws, bounded, counts drops, flushes on close.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { MemorySink, Publisher } from '../dist/index.js';

const record = (i) => ({ topic: 'agent.steps', key: `run-${i % 3}`, value: `{"n":${i}}` });

test('records are delivered in order, in the background', async () => {
  const sink = new MemorySink();
  const publisher = new Publisher(sink, { maxBatch: 7 });
  for (let i = 0; i < 100; i += 1) assert.equal(publisher.enqueue(record(i)), true);
  assert.equal(sink.records.length, 0, 'enqueue returns before anything is sent');
  assert.equal(await publisher.flush(1000), true);
  assert.deepEqual(sink.records.map((r) => r.value), Array.from({ length: 100 }, (_, i) => `{"n":${i}}`));
  assert.deepEqual(publisher.stats(), { enqueued: 100, published: 100, dropped: 0, sinkErrors: 0, pending: 0 });
});

test('a sink that is down: the queue holds up to maxQueue, drops and counts the rest, then delivers in order', async () => {
  const sink = new MemorySink();
  sink.down = true;
  const errors = [];
  const publisher = new Publisher(sink, { maxQueue: 10, initialBackoffMs: 5, maxBackoffMs: 20, onSinkError: (e) => errors.push(e) });
  const accepted = Array.from({ length: 25 }, (_, i) => publisher.enqueue(record(i)));
  assert.deepEqual(accepted, [...Array(10).fill(true), ...Array(15).fill(false)]);
  assert.equal(await publisher.flush(60), false, 'flush times out while the sink is down');
  assert.ok(errors.length >= 1);
  assert.equal(publisher.stats().dropped, 15);
  sink.down = false;
  assert.equal(await publisher.flush(1000), true);
  assert.deepEqual(sink.records.map((r) => r.value), Array.from({ length: 10 }, (_, i) => `{"n":${i}}`));
  const stats = publisher.stats();
  assert.equal(stats.published, 10);
  assert.ok(stats.sinkErrors >= 1);
});

test('a sink that throws synchronously or hangs never reaches the caller', async () => {
  const throwing = { send: () => { throw new Error('boom'); }, close: async () => {} };
  const publisher = new Publisher(throwing, { initialBackoffMs: 5 });
  assert.doesNotThrow(() => publisher.enqueue(record(1)));
  assert.equal(await publisher.flush(30), false);
  const hanging = { send: () => new Promise(() => {}), close: async () => {} };
  const stuck = new Publisher(hanging);
  stuck.enqueue(record(1));
  const started = Date.now();
  assert.equal(await stuck.flush(50), false);
  assert.ok(Date.now() - started < 1000);
});

test('close flushes, closes the sink, counts what could not be sent, and refuses later records', async () => {
  const sink = new MemorySink();
  const publisher = new Publisher(sink);
  publisher.enqueue(record(1));
  publisher.enqueue(record(2));
  const stats = await publisher.close(1000);
  assert.equal(stats.published, 2);
  assert.equal(sink.closed, true);
  assert.equal(publisher.enqueue(record(3)), false);
  assert.equal(publisher.stats().dropped, 1);

  const down = new MemorySink();
  down.down = true;
  const abandoned = new Publisher(down, { initialBackoffMs: 5 });
  abandoned.enqueue(record(1));
  abandoned.enqueue(record(2));
  const after = await abandoned.close(50);
  assert.equal(after.dropped, 2);
  assert.equal(after.pending, 0);
  assert.equal(down.closed, true);
});

test('KafkaSink with no broker listening: agent runs are unaffected, events are counted as dropped on close', async () => {
  const { createServer } = await import('node:net');
  const { ToolLoopAgent } = await import('ai');
  const { createLoopwarden, KafkaSink, isStepCount } = await import('../dist/index.js');
  const { modelStep, scriptedModel } = await import('./e2e/scenarios.mjs');
  const server = createServer();
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address();
  await new Promise((resolve) => server.close(resolve)); // nothing listens there now
  const errors = [];
  const lw = createLoopwarden({
    sink: new KafkaSink({ brokers: [`127.0.0.1:${port}`], logLevel: 0 }),
    maxQueue: 5,
    onSinkError: (e) => errors.push(e),
  });
  const started = Date.now();
  for (let i = 0; i < 3; i += 1) {
    const agent = new ToolLoopAgent({ model: scriptedModel([modelStep({ text: 'hi' })]), stopWhen: isStepCount(3) });
    const result = await lw.instrument(agent).run(`down-${i}`).generate({ prompt: 'p' });
    assert.equal(result.steps.length, 1);
  }
  assert.ok(Date.now() - started < 2000, 'runs do not wait for Kafka');
  const stats = await lw.close(1500);
  assert.deepEqual([stats.enqueued, stats.published, stats.dropped, stats.pending], [5, 0, 9, 0]);
  assert.ok(errors.length >= 1 && stats.sinkErrors >= 1);
});
