// A child process for the exit tests: a fleet publishes through a KafkaSink and the process then
// simply ends, never calling close(). Modes:
//   refused            nothing listens at the broker address
//   hung               a TCP server that accepts connections and never answers a byte
//   healthy HOST:PORT  a real broker (the topic is `agent.steps` unless TOPIC is given)
// Prints one JSON line on stdout when the fleet is done (the parent measures how long the process
// takes to exit after it); the publisher's loss lines go to stderr.
import { createServer } from 'node:net';
import { ToolLoopAgent } from 'ai';
import { createLoopwarden, isStepCount, KafkaSink } from '../../dist/index.js';
import { modelStep, scriptedModel } from '../e2e/scenarios.mjs';

const [mode, arg, topic = 'agent.steps'] = process.argv.slice(2);
let brokers;
if (mode === 'hung') {
  const server = createServer((socket) => socket.unref()); // accept, never answer
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
  server.unref();
  brokers = [`127.0.0.1:${server.address().port}`];
} else if (mode === 'refused') {
  const probe = createServer();
  await new Promise((resolve) => probe.listen(0, '127.0.0.1', resolve));
  brokers = [`127.0.0.1:${probe.address().port}`];
  await new Promise((resolve) => probe.close(resolve)); // nothing listens there now
} else {
  brokers = [arg];
}
const lw = createLoopwarden({
  sink: new KafkaSink({ brokers, logger: { error() {}, warn() {} } }), // the Kafka client's own lines are not under test
  topics: { steps: topic },
  exitFlushMs: 1500,
  initialBackoffMs: 50,
  maxBackoffMs: 400,
  logger: { warn: (m) => process.stderr.write(`${m}\n`), error: (m) => process.stderr.write(`${m}\n`) },
});
for (let i = 0; i < 3; i += 1) {
  const agent = new ToolLoopAgent({ model: scriptedModel([modelStep({ text: 'hi' })]), stopWhen: isStepCount(3) });
  await lw.instrument(agent).run(`exit-${mode}-${i}`).generate({ prompt: 'p' });
}
// healthy: give the broker time to take everything before the app's own work ends
if (mode === 'healthy') await lw.flush(20_000);
process.stdout.write(`${JSON.stringify({ stats: lw.stats() })}\n`);
// ... and the process ends here, without close()
