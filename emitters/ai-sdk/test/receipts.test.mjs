// Signed receipts (spec.md section 10): the canonical bytes and Ed25519 signatures agree with Python both ways.
import assert from 'node:assert/strict';
import { generateKeyPairSync } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { test } from 'node:test';

import {
  LoopwardenConfigError,
  MemorySink,
  canonicalize,
  createLoopwarden,
  expectOutcome,
  loadSigningKey,
  outcomeExpected,
  parseTrustedVerifiers,
  receiptSigningBytes,
  receiptTrust,
  signReceipt,
} from '../dist/index.js';
import { tsReceiptVectors } from '../scripts/receipt-vectors.mjs';

const PY = JSON.parse(readFileSync(new URL('../../../tests/vectors/receipts-golden.json', import.meta.url), 'utf8'));
const TS_GOLDEN = new URL('./vectors/ts-receipts-golden.json', import.meta.url);

test('the committed ts-receipts-golden.json is what the signer produces now (run `npm run vectors` to update)', () => {
  assert.equal(readFileSync(TS_GOLDEN, 'utf8'), tsReceiptVectors());
});

test('Python-signed receipts: same canonical bytes here, and each signature verifies', () => {
  const trusted = parseTrustedVerifiers(PY.trusted);
  assert.ok(PY.cases.length >= 7);
  for (const { receipt, canonical } of PY.cases) {
    const parsed = JSON.parse(receipt);
    assert.equal(receiptSigningBytes(parsed).toString('utf8'), canonical, receipt);
    assert.equal(receiptTrust(parsed, trusted), null, receipt);
  }
});

test('a Python-signed receipt changed in any signed field, unsigned or under another key id is not trusted', () => {
  const trusted = parseTrustedVerifiers(PY.trusted);
  const signed = JSON.parse(PY.cases[1].receipt);
  assert.equal(receiptTrust({ ...signed, verified: !signed.verified }, trusted), 'bad_signature');
  assert.equal(receiptTrust({ ...signed, evidence: { ...signed.evidence, size: 1025 } }, trusted), 'bad_signature');
  assert.equal(receiptTrust({ ...signed, run_id: 'other' }, trusted), 'bad_signature');
  assert.equal(receiptTrust({ ...signed, signature: { ...signed.signature, sig: 'AAAA' } }, trusted), 'bad_signature');
  assert.equal(receiptTrust({ ...signed, signature: undefined }, trusted), 'unsigned');
  assert.equal(receiptTrust({ ...signed, signature: { ...signed.signature, key_id: 'nobody' } }, trusted), 'unknown_key');
  // The occurrence a receipt names is signed: moved to another run_started, added or dropped, it no longer verifies.
  const bound = JSON.parse(PY.cases.find((c) => JSON.parse(c.receipt).run_started_ts !== undefined).receipt);
  assert.equal(receiptTrust(bound, trusted), null);
  assert.equal(receiptTrust({ ...bound, run_started_ts: bound.run_started_ts + 1 }, trusted), 'bad_signature');
  assert.equal(receiptTrust({ ...bound, run_started_ts: undefined }, trusted), 'bad_signature');
  assert.equal(receiptTrust({ ...signed, run_started_ts: 1 }, trusted), 'bad_signature');
});

test('a key file in the format `loopwarden keys new` writes signs receipts that verify against its printed key', () => {
  const { privateKey, publicKey } = generateKeyPairSync('ed25519');
  const file = `# key_id: person-1\n${privateKey.export({ format: 'pem', type: 'pkcs8' })}`;
  const key = loadSigningKey(file);
  assert.equal(key.keyId, 'person-1');
  const trusted = parseTrustedVerifiers(`person-1=${publicKey.export({ format: 'jwk' }).x}`);
  const receipt = { type: 'outcome_receipt', run_id: 'r', ts: 1, receipt_id: 'x', kind: 'other', verifier: 'human', verified: true };
  const signed = signReceipt(receipt, key);
  assert.equal(receiptTrust(signed, trusted), null);
  assert.equal(receiptTrust(JSON.parse(JSON.stringify(signed)), trusted), null);
});

test('values without a canonical form, and malformed trusted-verifier settings, are refused by name', () => {
  assert.throws(() => canonicalize({ x: 2 ** 60 }, true), (e) => e instanceof LoopwardenConfigError && /\$\.x: integer .* beyond/.test(e.message));
  assert.throws(() => signReceipt({ type: 'outcome_receipt', run_id: 'r', ts: 1, receipt_id: 'x', kind: 'file', verifier: 'destination', verified: true, evidence: { n: 2 ** 60 } }, loadSigningKey(`# key_id: k\n${generateKeyPairSync('ed25519').privateKey.export({ format: 'pem', type: 'pkcs8' })}`)), /\$\.n: integer/);
  assert.throws(() => canonicalize({ y: Number.NaN }), /\$\.y: NaN is not a finite number/);
  assert.equal(canonicalize({ b: 1e21, a: [0.1, -0, 'é'] }), '{"a":[0.1,0,"é"],"b":1e+21}');
  assert.throws(() => parseTrustedVerifiers('k1'), /entry "k1" is not KEY_ID=PUBLIC_KEY/);
  assert.throws(() => parseTrustedVerifiers('k1=short'), /the public key of "k1", "short"/);
});

test('expectOutcome sends an outcome_expected on the steps topic, keyed by run id; bad input is named', async () => {
  const sink = new MemorySink();
  const lw = createLoopwarden({ sink });
  const sent = await expectOutcome(lw, { runId: 'run-1', expectationId: 'exp-1', kind: 'file', target: 'file:///srv/out/report.pdf', checks: { min_size: 1000, content_type: 'application/pdf' }, ts: 5 });
  assert.deepEqual(sink.records, [{ topic: 'agent.steps', key: 'run-1', value: JSON.stringify(sent) }]);
  assert.deepEqual(sent, { type: 'outcome_expected', run_id: 'run-1', ts: 5, expectation_id: 'exp-1', kind: 'file', target: 'file:///srv/out/report.pdf', checks: { min_size: 1000, content_type: 'application/pdf' } });
  assert.throws(() => outcomeExpected({ runId: 'r', expectationId: 'e', kind: 'nope', target: 'file:///x' }), /kind must be one of/);
  assert.throws(() => outcomeExpected({ runId: 'r', expectationId: 'e', kind: 'file', target: 'ftp://x' }), /target must be a file:\/\/, https:\/\//);
  await lw.close(1000);
});
