// The differential oracle's output is well formed, reproducible, and consistent with the SDK loop.
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { test } from 'node:test';
import { FINISH_REASONS, TOOL_CALL_STATUSES, conditionIds } from '../dist/index.js';
import { schemaValidator } from './helpers/schema.mjs';

const ORACLE = fileURLToPath(new URL('./oracle/sdk-oracle.mjs', import.meta.url));
const run = (seed, cases) =>
  execFileSync(process.execPath, [ORACLE, '--seed', String(seed), '--cases', String(cases)], { encoding: 'utf8' })
    .split('\n')
    .filter(Boolean);

const isCount = (v) => v === null || (Number.isSafeInteger(v) && v >= 0);

test('sdk-oracle prints one well-formed JSON line per case', () => {
  const lines = run(3, 200);
  assert.equal(lines.length, 200);
  const validate = schemaValidator();
  const kinds = new Set();
  let evaluated = 0;
  let fired = 0;
  lines.forEach((line, i) => {
    const c = JSON.parse(line);
    assert.deepEqual(Object.keys(c), ['case', 'stop_when', 'steps', 'evaluations']);
    assert.equal(c.case, i);
    // stop_when is a list of spec.md Conditions: valid inside a run_started policy
    const asEvent = { type: 'run_started', run_id: 'o', ts: 0, agent: 'o', policy: { version: 'o', stop_when: c.stop_when } };
    assert.equal(validate(asEvent), null, line);
    c.stop_when.forEach((cond) => kinds.add(cond.kind));
    const ids = new Set(c.stop_when.flatMap(conditionIds));
    assert.ok(c.steps.length >= 1, line);
    assert.equal(c.evaluations.length, c.steps.length, line);
    c.steps.forEach((s, k) => {
      assert.deepEqual(Object.keys(s), ['finish_reason', 'tool_calls', 'usage', 'steered']);
      assert.ok(FINISH_REASONS.includes(s.finish_reason), line);
      assert.equal(typeof s.steered, 'boolean', line);
      for (const call of s.tool_calls) {
        assert.deepEqual(Object.keys(call), ['id', 'name', 'status']);
        assert.ok(TOOL_CALL_STATUSES.includes(call.status), line);
      }
      assert.deepEqual(Object.keys(s.usage), ['input_tokens', 'output_tokens', 'total_tokens']);
      assert.ok(Object.values(s.usage).every(isCount), line);
      const e = c.evaluations[k];
      assert.equal(e.step, k);
      assert.equal(typeof e.evaluated, 'boolean');
      assert.deepEqual(e.fired, [...e.fired].sort(), 'fired is sorted');
      for (const id of e.fired) assert.ok(ids.has(id), `${id} is a condition of the policy: ${line}`);
      // the SDK only evaluates after a step whose client tool calls all got an answer, or, with a
      // steering message waiting, after a step without tool calls that did not end in an error
      if (e.evaluated) {
        const answered = s.tool_calls.length > 0 && s.tool_calls.every((t) => ['result', 'error', 'denied'].includes(t.status));
        const steeredTextOnly = s.steered && s.tool_calls.length === 0 && s.finish_reason !== 'error';
        assert.ok(answered || steeredTextOnly, line);
        assert.notEqual(s.finish_reason, 'interrupted', line);
      }
      // the first evaluation at which something fired is where the SDK stopped
      if (e.evaluated && e.fired.length > 0) assert.equal(k, c.steps.length - 1, line);
      evaluated += e.evaluated ? 1 : 0;
      fired += e.fired.length > 0 ? 1 : 0;
    });
  });
  assert.deepEqual([...kinds].sort(), ['loop_finished', 'step_count', 'token_budget', 'tool_call']);
  assert.ok(evaluated > 50 && fired > 20, `the cases exercise evaluations (${evaluated}) and firings (${fired})`);
});

test('sdk-oracle is reproducible: same seed, same lines; a case does not depend on N', () => {
  const a = run(11, 60);
  assert.deepEqual(run(11, 60), a);
  assert.deepEqual(run(11, 20), a.slice(0, 20));
  assert.notDeepEqual(run(12, 20), a.slice(0, 20));
});
