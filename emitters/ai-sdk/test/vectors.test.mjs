// Wire conformance: the encoder, the decoder, the JSON Schema and the golden vectors both ways.
import assert from 'node:assert/strict';
import { existsSync, readFileSync } from 'node:fs';
import { test } from 'node:test';
import { decodeEvent, encodeEvent, EVENT_TYPES, LoopwardenDecodeError } from '../dist/index.js';
import { goldenEvents, goldenJsonl } from '../scripts/golden-events.mjs';
import { canonicalJson, PYTHON_GOLDEN_PATH, schemaValidator } from './helpers/schema.mjs';

const TS_GOLDEN = new URL('./vectors/ts-golden.jsonl', import.meta.url);
const lines = (text) => text.split('\n').filter((line) => line.trim() !== '');

test('the committed ts-golden.jsonl is what the encoder produces now (run `npm run vectors` to update)', () => {
  assert.equal(readFileSync(TS_GOLDEN, 'utf8'), goldenJsonl());
});

test('ts-golden covers every event type', () => {
  const types = new Set(goldenEvents().map((e) => e.type));
  assert.deepEqual([...types].sort(), [...EVENT_TYPES].sort());
});

test('every ts-golden line validates against schema/loopwarden.schema.json', () => {
  const validate = schemaValidator();
  for (const [i, line] of lines(readFileSync(TS_GOLDEN, 'utf8')).entries()) {
    assert.equal(validate(JSON.parse(line)), null, `ts-golden line ${i + 1}: ${line}`);
  }
});

test('every ts-golden line decodes and re-encodes byte for byte', () => {
  for (const line of lines(readFileSync(TS_GOLDEN, 'utf8'))) {
    assert.equal(encodeEvent(decodeEvent(line)), line);
  }
});

test('python-golden.jsonl: every line validates and round-trips through the TS types to the same JSON', () => {
  assert.ok(
    existsSync(PYTHON_GOLDEN_PATH),
    `${PYTHON_GOLDEN_PATH} is missing: loopwarden's Python-encoded vectors (tests/vectors/make_golden.py) must be committed`,
  );
  const validate = schemaValidator();
  const all = lines(readFileSync(PYTHON_GOLDEN_PATH, 'utf8'));
  assert.ok(all.length > 0, 'python-golden.jsonl is empty');
  const seen = new Set();
  for (const [i, line] of all.entries()) {
    const where = `python-golden line ${i + 1}: ${line}`;
    const parsed = JSON.parse(line);
    assert.equal(validate(parsed), null, where);
    const event = decodeEvent(line);
    seen.add(event.type);
    // Same JSON value; key order and `300.0` vs `300` are encodings of the same value.
    assert.equal(canonicalJson(JSON.parse(encodeEvent(event))), canonicalJson(parsed), where);
  }
  assert.deepEqual([...seen].sort(), [...EVENT_TYPES].sort(), 'python-golden should cover every event type');
});

test('decodeEvent names the bad field', () => {
  const cases = [
    ['{"type":"nope","run_id":"r","ts":1}', /Expected one of .* - at `\$\.type`/],
    ['{"type":"step_finished","run_id":"r","ts":1,"step":-1,"finish_reason":"stop"}', /`int` >= 0 - at `\$\.step`/],
    ['{"type":"step_finished","run_id":"r","ts":1,"step":0,"finish_reason":"done"}', /at `\$\.finish_reason`/],
    ['{"type":"run_started","run_id":"","ts":1,"agent":"a","policy":{"version":"v"}}', /length >= 1 - at `\$\.run_id`/],
    [
      '{"type":"run_started","run_id":"r","ts":1,"agent":"a","policy":{"version":"v","stop_when":[{"kind":"tool_call","tools":[]}]}}',
      /at `\$\.policy\.stop_when\[0\]\.tools`/,
    ],
    [
      '{"type":"run_ended","run_id":"r","ts":1,"cause":"approval_required","step_count":1,"approval":null,"error_name":null}',
      /approval when cause is approval_required - at `\$\.approval`/,
    ],
    ['{"type":"run_ended","run_id":"r","ts":1,"cause":"unknown","step_count":1,"error_name":null}', /required field - at `\$\.approval`/],
    ['{"type":"approval_resolved","run_id":"r","ts":1.5,"approval_id":"a","approved":true}', /`int` - at `\$\.ts`/],
    ['not json', /Invalid JSON/],
  ];
  for (const [input, message] of cases) {
    assert.throws(() => decodeEvent(input), (error) => error instanceof LoopwardenDecodeError && message.test(error.message), input);
  }
});

test('decodeEvent ignores unknown fields (schema evolution)', () => {
  const event = decodeEvent('{"type":"approval_resolved","run_id":"r","ts":1,"approval_id":"a","approved":true,"added_later":3}');
  assert.equal(encodeEvent(event), '{"type":"approval_resolved","run_id":"r","ts":1,"approval_id":"a","approved":true}');
});
