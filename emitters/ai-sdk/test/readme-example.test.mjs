// The README's "Test your agent with a mock model" example, run as it stands: extracted from
// README.md, written next to this file (so `ai` and `@loopwarden/ai-sdk` resolve as in a user's
// project: the package refers to itself by name through its `exports`), and executed.
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { readFileSync, rmSync, writeFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { test } from 'node:test';
import { fileURLToPath } from 'node:url';

const here = dirname(fileURLToPath(import.meta.url));

test("the README's mock-model example runs and its assertions hold", () => {
  const readme = readFileSync(join(here, '..', 'README.md'), 'utf8');
  const block = readme.match(/```js\n(\/\/ example: test-with-a-mock-model\n[\s\S]*?)```/);
  assert.ok(block, 'README.md has no ```js block starting with "// example: test-with-a-mock-model"');
  const file = join(here, '.readme-example.tmp.mjs');
  writeFileSync(file, `globalThis.AI_SDK_LOG_WARNINGS = false;\n${block[1]}\nconsole.log('example ok');\n`);
  try {
    const run = spawnSync(process.execPath, [file], { encoding: 'utf8', timeout: 60_000 });
    assert.equal(run.status, 0, run.stderr);
    assert.equal(run.stdout.trim(), 'example ok');
  } finally {
    rmSync(file, { force: true });
  }
});
