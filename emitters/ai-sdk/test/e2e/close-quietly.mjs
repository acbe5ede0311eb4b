// Publishes a few events through a KafkaSink to a real broker, then closes: prints the close's stats
// as one JSON line. tests/e2e/test_emitter_close.py runs it and checks nothing else is printed
// (kafkajs logs two ERROR lines on a clean close unless the sink quiets them).
import { createLoopwarden, KafkaSink } from '../../dist/index.js';

const [broker, topic] = process.argv.slice(2);
const lw = createLoopwarden({
  sink: new KafkaSink({ brokers: [broker] }),
  agent: 'close-test',
  policyVersion: 'v1',
  topics: { steps: topic, outcomes: topic },
});
for (let i = 0; i < 5; i += 1) {
  lw.publishReceipt({ runId: `close-${i}`, receiptId: `rc-${i}`, kind: 'file', verifier: 'destination', verified: true });
}
await new Promise((resolve) => setTimeout(resolve, 1000)); // let the sink connect and send
console.log(JSON.stringify(await lw.close()));
