// A child process for publisher.test.mjs: a KafkaSink against a broker in trouble.
//   hung <closeMs>  a TCP server that accepts connections and never answers a byte
//   down <runMs>    nothing listening at all (connection refused), for `runMs`, default logger
// Prints one JSON line on stdout: how long close() took and the publisher's stats. The parent
// measures how long the process then takes to exit by itself (nothing may hold the event loop).
import { createServer } from 'node:net';
import { KafkaSink, Publisher } from '../../dist/index.js';

const [mode, arg] = process.argv.slice(2);
let brokers;
if (mode === 'hung') {
  const server = createServer((socket) => socket.unref()); // accept, never answer
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
  server.unref();
  brokers = [`127.0.0.1:${server.address().port}`];
} else {
  const probe = createServer();
  await new Promise((resolve) => probe.listen(0, '127.0.0.1', resolve));
  brokers = [`127.0.0.1:${probe.address().port}`];
  await new Promise((resolve) => probe.close(resolve)); // nothing listens there now
}
const publisher = new Publisher(new KafkaSink({ brokers }), { initialBackoffMs: 50, maxBackoffMs: 400 });
let n = 0;
// three at once (a loaded machine may run few interval ticks), then one every 50 ms
for (; n < 3; ) publisher.enqueue({ topic: 'agent.steps', key: 'r', value: `{"n":${n++}}` });
const feed = setInterval(() => publisher.enqueue({ topic: 'agent.steps', key: 'r', value: `{"n":${n++}}` }), 50);
await new Promise((resolve) => setTimeout(resolve, mode === 'hung' ? 300 : Number(arg)));
clearInterval(feed);
const started = Date.now();
const stats = await publisher.close(mode === 'hung' ? Number(arg) : 1000);
process.stdout.write(`${JSON.stringify({ closeMs: Date.now() - started, stats })}\n`);
