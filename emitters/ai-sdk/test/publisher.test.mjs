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
  // 9 events into a queue of 5: each run_ended evicts the newest queued step or run_started, and
  // at close two events_dropped evict the last two; nothing was delivered, all 9 events are dropped.
  assert.deepEqual([stats.enqueued, stats.published, stats.dropped, stats.pending], [9, 0, 9, 0]);
  assert.ok(errors.length >= 1 && stats.sinkErrors >= 1);
});

// Runs test/helpers/kafka-trouble.mjs; resolves with its JSON line, stderr and how long after
// printing it the process took to exit on its own.
async function trouble(mode, arg) {
  const { spawn } = await import('node:child_process');
  const child = spawn(process.execPath, [new URL('./helpers/kafka-trouble.mjs', import.meta.url).pathname, mode, String(arg)]);
  let stdout = '';
  let stderr = '';
  let printedAt;
  child.stdout.on('data', (d) => {
    stdout += d;
    printedAt ??= Date.now();
  });
  child.stderr.on('data', (d) => (stderr += d));
  const killer = setTimeout(() => child.kill('SIGKILL'), 60_000);
  const code = await new Promise((resolve) => child.on('exit', resolve));
  clearTimeout(killer);
  return { code, out: stdout ? JSON.parse(stdout) : undefined, stderr, exitAfterMs: Date.now() - (printedAt ?? Date.now()) };
}

test('a broker that accepts TCP and never answers: close(2000) returns within its budget and the process can exit', async () => {
  // Awaiting kafkajs' pending connect would take 22-27 s, and a socket and kafkajs' request-timeout
  // interval would hold the event loop >= 90 s: the sink destroys its sockets instead.
  const { code, out, exitAfterMs } = await trouble('hung', 2000);
  assert.equal(code, 0);
  assert.ok(out.closeMs <= 2500, `close(2000) took ${out.closeMs} ms`);
  assert.ok(exitAfterMs < 5000, `the process exited ${exitAfterMs} ms after close returned`);
  assert.ok(out.stats.enqueued >= 3, JSON.stringify(out.stats));
  assert.equal(out.stats.published, 0);
  assert.equal(out.stats.dropped, out.stats.enqueued, 'every undelivered event is counted as dropped');
  assert.equal(out.stats.pending, 0);
});

test('Kafka down: the client logs a few single lines through the sink logger, never stack traces', async () => {
  // kafkajs' own logger would write ~48 ERROR lines with stack traces to stderr in 14 s.
  const { code, out, stderr } = await trouble('down', 4000);
  assert.equal(code, 0);
  assert.ok(out.stats.sinkErrors >= 3, 'the sink kept failing');
  const all = stderr.split('\n').filter((l) => l.trim());
  // the publisher's own closing line counts what was lost (tested below); the Kafka client's are few
  const lines = all.filter((l) => !l.startsWith('loopwarden: closing: '));
  assert.equal(all.length - lines.length, 1, stderr);
  assert.ok(lines.length >= 1 && lines.length <= 5, `${lines.length} lines:\n${stderr}`);
  for (const line of lines) {
    assert.match(line, /^loopwarden KafkaSink: kafkajs ERROR \[\w+\] /);
    assert.doesNotMatch(line, /stack|\n\s+at /);
  }
});

test('RateLimitedLog lets a burst through per interval and reports what it held back', async () => {
  const { RateLimitedLog } = await import('../dist/index.js');
  const seen = [];
  let now = 0;
  const log = new RateLimitedLog({ error: (m) => seen.push(['error', m]), warn: (m) => seen.push(['warn', m]) }, 2, 1000, () => now);
  for (let i = 0; i < 5; i += 1) log.write('error', `e${i}`);
  assert.deepEqual(seen, [['error', 'e0'], ['error', 'e1']]);
  assert.equal(log.pendingSuppressed, 3);
  now = 1000;
  log.write('info', 'i0'); // no info method: goes to warn
  assert.deepEqual(seen.at(-1), ['warn', 'i0 (3 more Kafka client lines suppressed before this one)']);
  assert.equal(log.pendingSuppressed, 0);
  const throwing = new RateLimitedLog({ error: () => { throw new Error('x'); }, warn: () => {} });
  assert.doesNotThrow(() => throwing.write('error', 'line'));
});

test('KafkaSink hands kafkajs lines to the logger it is given', async () => {
  const { KafkaSink } = await import('../dist/index.js');
  const lines = [];
  const sink = new KafkaSink({ brokers: ['127.0.0.1:1'], logger: { error: (m) => lines.push(m), warn: (m) => lines.push(m) } });
  await assert.rejects(sink.send([{ topic: 't', key: 'k', value: '{}' }]));
  await sink.close(100);
  assert.ok(lines.length >= 1 && lines.length <= 5, lines.join('\n'));
  assert.ok(lines.every((l) => l.startsWith('loopwarden KafkaSink: kafkajs ERROR') && !l.includes('\n')));
  assert.equal(sink.openSockets(), 0);
  await assert.rejects(sink.send([{ topic: 't', key: 'k', value: '{}' }]), /closed/);
});

// --- loss is never silent (docs/contract.md section 11) -------------------------------------------

const ev = (key, type, n = 0) => ({ topic: 'agent.steps', key, value: JSON.stringify({ type, run_id: key, n }) });
const lossReport = (key, count) => ({ topic: 'agent.steps', key, value: JSON.stringify({ type: 'events_dropped', run_id: key, count }) });
const kinds = (sink) => sink.records.map((r) => JSON.parse(r.value)).map((e) => `${e.run_id}:${e.type}${e.count ? `:${e.count}` : ''}`);

test('queue policy: a full queue drops run_active first, then the newest other event; run_ended last', async () => {
  const { PRIORITY } = await import('../dist/index.js');
  const sink = new MemorySink();
  sink.down = true;
  const lines = [];
  const publisher = new Publisher(sink, { maxQueue: 4, initialBackoffMs: 5, lossReport, logger: { warn: (m) => lines.push(m), error: (m) => lines.push(m) } });
  assert.equal(publisher.enqueue(ev('a', 'step_finished', 0)), true);
  assert.equal(publisher.enqueue(ev('a', 'run_active'), PRIORITY.liveness), true);
  assert.equal(publisher.enqueue(ev('b', 'step_finished', 0)), true);
  assert.equal(publisher.enqueue(ev('b', 'step_finished', 1)), true);
  // full: a step evicts the run_active (the lowest rank)
  assert.equal(publisher.enqueue(ev('a', 'step_finished', 1)), true);
  // full of steps: a new step is refused (same rank: the new one goes) ...
  assert.equal(publisher.enqueue(ev('b', 'step_finished', 2)), false);
  // ... and a run_ended evicts the newest step (a's step 1), with a's loss report before it
  assert.equal(publisher.enqueue(ev('a', 'run_ended'), PRIORITY.end), true);
  assert.equal(publisher.stats().dropped, 4);
  assert.ok(lines.length >= 1 && /dropped an event of run "a" \(1 of this run not yet reported, 1 in all\)/.test(lines[0]), lines.join('\n'));
  sink.down = false;
  assert.equal(await publisher.flush(1000), true);
  // a's report (run_active and step 1: 2) goes right before its run_ended; b's (steps 1, 2 ... as
  // counted) once there was room again
  const delivered = kinds(sink);
  assert.deepEqual(delivered.slice(0, 2), ['a:step_finished', 'b:step_finished']);
  assert.ok(delivered.indexOf('a:events_dropped:2') === delivered.indexOf('a:run_ended') - 1, delivered.join(' '));
  const reported = sink.records.map((r) => JSON.parse(r.value)).filter((e) => e.type === 'events_dropped');
  assert.equal(reported.reduce((n, e) => n + e.count, 0), publisher.stats().dropped);
});

test('a run_ended is dropped only when the queue holds nothing but run_ended and loss reports', async () => {
  const { PRIORITY } = await import('../dist/index.js');
  const sink = new MemorySink();
  sink.down = true;
  const publisher = new Publisher(sink, { maxQueue: 2, initialBackoffMs: 5, lossReport, logger: { warn() {}, error() {} } });
  publisher.enqueue(ev('a', 'run_ended'), PRIORITY.end);
  publisher.enqueue(ev('b', 'run_ended'), PRIORITY.end);
  assert.equal(publisher.enqueue(ev('c', 'run_ended'), PRIORITY.end), false);
  assert.equal(publisher.enqueue(ev('c', 'step_finished')), false);
  assert.equal(publisher.stats().dropped, 2);
  sink.down = false;
  await publisher.close(2000);
  assert.deepEqual(kinds(sink), ['a:run_ended', 'b:run_ended', 'c:events_dropped:2']);
});

test('a sink that cannot keep up (20 ms a batch, small queue): every run that lost events is told so, the counts add up to stats().dropped', async () => {
  const { lossyFleet } = await import('./e2e/slow-sink.mjs');
  const { sink, stats, ids, lines } = await lossyFleet({ runs: 60, maxQueue: 20 });
  const events = sink.events();
  const lost = new Map();
  for (const e of events) if (e.type === 'events_dropped') lost.set(e.run_id, (lost.get(e.run_id) ?? 0) + e.count);
  assert.ok(stats.dropped > 0 && lost.size > 0, JSON.stringify(stats));
  assert.equal([...lost.values()].reduce((a, b) => a + b, 0), stats.dropped);
  assert.equal(stats.pending, 0);
  for (const id of ids) {
    const mine = events.filter((e) => e.run_id === id);
    const delivered = mine.filter((e) => e.type !== 'events_dropped').length;
    // four steps, run_started and run_ended: what was not delivered was reported
    assert.equal(delivered + (lost.get(id) ?? 0), 6, `${id}: ${JSON.stringify(mine)}`);
  }
  assert.ok(lines.length >= 1 && lines.length <= 6, `rate-limited loss lines, naming run and count:\n${lines.join('\n')}`);
  assert.match(lines[0], /dropped an event of run "loss-\d+" \(\d+ of this run not yet reported, \d+ in all\)/);
});

test('process.exit() with events queued: nothing can be sent, but the loss is logged with its runs', async () => {
  const { spawnSync } = await import('node:child_process');
  const code = `
    import { MemorySink, createLoopwarden } from './dist/index.js';
    const sink = new MemorySink(); sink.down = true;
    const lw = createLoopwarden({ sink, initialBackoffMs: 1000 });
    for (let i = 0; i < 4; i++) lw.emit({ type: 'run_active', run_id: 'r' + (i % 2), ts: 1, segment: 0, in: 'model' });
    setTimeout(() => process.exit(0), 50);`;
  const child = spawnSync(process.execPath, ['--input-type=module', '-e', code], { cwd: new URL('..', import.meta.url), encoding: 'utf8', timeout: 30_000 });
  assert.equal(child.status, 0, child.stderr);
  assert.match(child.stderr, /^loopwarden: process exiting: 4 event\(s\) of 2 run\(s\) were lost and could not be reported \(sink unavailable\): "r0" \(2\), "r1" \(2\)$/m);
});
