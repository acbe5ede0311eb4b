// The `ai` under test is inside the peer range this package declares; `make test` runs the whole
// suite twice: on the newest `ai` (the devDependency) and on the lowest the range admits.
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { test } from 'node:test';

const require = createRequire(import.meta.url);
const parse = (v) => v.split('-')[0].split('.').map(Number);
const cmp = (a, b) => {
  const [x, y] = [parse(a), parse(b)];
  for (let i = 0; i < 3; i += 1) if (x[i] !== y[i]) return x[i] - y[i];
  return 0;
};

test('the installed ai is inside the declared peer range (and is the one asked for)', (t) => {
  const range = JSON.parse(readFileSync(new URL('../package.json', import.meta.url))).peerDependencies.ai;
  const m = /^>=(\S+) <(\d+)$/.exec(range);
  assert.ok(m, `peer range of the form '>=X <N', got ${range}`);
  const installed = require('ai/package.json').version;
  t.diagnostic(`ai ${installed} (peer range ${range})`);
  assert.ok(cmp(installed, m[1]) >= 0, `ai ${installed} is below the range's lowest, ${m[1]}`);
  assert.ok(parse(installed)[0] < Number(m[2]), `ai ${installed} is not below ${m[2]}`);
  if (process.env.AI_EXPECTED_VERSION) assert.equal(installed, process.env.AI_EXPECTED_VERSION);
});
