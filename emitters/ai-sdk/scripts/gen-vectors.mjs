#!/usr/bin/env node
// Regenerate test/vectors/ts-golden.jsonl with the package's own encoder (run `npm run vectors`).
// Tests never write it; test/vectors.test.mjs fails when it is out of date.
import { writeFileSync } from 'node:fs';
import { goldenEvents, goldenJsonl } from './golden-events.mjs';

const target = new URL('../test/vectors/ts-golden.jsonl', import.meta.url);
writeFileSync(target, goldenJsonl());
process.stdout.write(`wrote ${goldenEvents().length} events to ${target.pathname}\n`);
