#!/usr/bin/env node
// Regenerate test/vectors/ts-golden.jsonl with the package's own encoder (run `npm run vectors`),
// and test/vectors/ts-receipts-golden.json (receipts signed here, verified by Python).
// Tests never write them; test/vectors.test.mjs and test/receipts.test.mjs fail when they are out of date.
import { writeFileSync } from 'node:fs';
import { goldenEvents, goldenJsonl } from './golden-events.mjs';
import { tsReceiptVectors } from './receipt-vectors.mjs';

const target = new URL('../test/vectors/ts-golden.jsonl', import.meta.url);
writeFileSync(target, goldenJsonl());
process.stdout.write(`wrote ${goldenEvents().length} events to ${target.pathname}\n`);
const receipts = new URL('../test/vectors/ts-receipts-golden.json', import.meta.url);
writeFileSync(receipts, tsReceiptVectors());
process.stdout.write(`wrote signed receipts to ${receipts.pathname}\n`);
