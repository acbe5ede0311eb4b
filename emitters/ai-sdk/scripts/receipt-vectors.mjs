// Receipts signed by the TypeScript side (dist/receipts.js), for Python to verify: the cases and
// the deterministic test key. scripts/gen-vectors.mjs writes them to test/vectors/ts-receipts-golden.json.
import { createPrivateKey, createPublicKey } from 'node:crypto';
import { receiptSigningBytes, signReceipt } from '../dist/index.js';

// A test key from fixed seed bytes 32..63 (PKCS#8 DER prefix of an Ed25519 key): never trust it anywhere.
const SEED = Buffer.from(Array.from({ length: 32 }, (_, i) => 32 + i));
const PKCS8_PREFIX = Buffer.from('302e020100300506032b657004220420', 'hex');
export const TS_KEY = {
  keyId: 'golden-ts',
  privateKey: createPrivateKey({ key: Buffer.concat([PKCS8_PREFIX, SEED]), format: 'der', type: 'pkcs8' }),
};
const TS = 1_780_000_000_000;

const EVIDENCE = [
  {},
  { bytes: 2048, sha256: 'e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855', content_type: 'text/csv' },
  { int_max: Number.MAX_SAFE_INTEGER, int_min: -Number.MAX_SAFE_INTEGER, zero: 0, neg_zero: -0, half: 0.5 },
  { tenth: 0.1, sum: 0.1 + 0.2, third: 1 / 3, big: 1e21, big2: 1.5e300, tiny: 1e-7, small: 0.000001, min: 5e-324, max: Number.MAX_VALUE, neg: -987.654321, mid: 123456789.125 },
  { ctl: 'a\u0000b\u001fc"d\\e\nf\tg\rh\bi\fj\u007f', uni: 'é€😀 \u2028', slash: 'a/b' },
  { '\u20ac': 1, '\u{1F600}': 2, '\uff61': 3, a: 4, B: 5, '': 6, aa: 7, '\u00e9': 8 },
  { flag: true, no: false },
];

// Cases (by index of EVIDENCE) repeated with run_started_ts: the occurrence the receipt answers, signed.
const BOUND = [[0, TS - 60_000], [1, TS - 1]];

export function tsReceiptVectors() {
  const all = [...EVIDENCE.map((evidence) => [evidence, undefined]), ...BOUND.map(([i, started]) => [EVIDENCE[i], started])];
  const cases = all.map(([evidence, started], i) => {
    const receipt = {
      type: 'outcome_receipt', run_id: `ts-golden-${i}`, ts: TS + i, receipt_id: `ts-rc-${i}`, kind: 'record',
      verifier: 'validator', verified: i % 2 === 1, evidence, ...(started === undefined ? {} : { run_started_ts: started }),
    };
    return { receipt: JSON.stringify(signReceipt(receipt, TS_KEY)), canonical: receiptSigningBytes(receipt).toString('utf8') };
  });
  const x = createPublicKey(TS_KEY.privateKey).export({ format: 'jwk' }).x;
  return `${JSON.stringify({ trusted: `${TS_KEY.keyId}=${x}`, cases }, null, 1)}\n`;
}
