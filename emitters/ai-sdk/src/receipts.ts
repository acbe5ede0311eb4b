/**
 * Signed receipts and declared outcomes (docs/contract.md section 10).
 *
 * - `receiptSigningBytes`: the canonical bytes a receipt's signature covers — RFC 8785 (JCS) of
 *   the receipt without `signature`, byte-identical to `loopwarden.codecs.canonical` in Python.
 * - `signReceipt` / `receiptTrust`: Ed25519 with Node's built-in `crypto`.
 * - `expectOutcome`: an `outcome_expected` on the steps topic — what the run must produce, for a
 *   verifier (`loopwarden verify`) to check at the destination.
 */
import { createPrivateKey, createPublicKey, sign, verify, type KeyObject } from 'node:crypto';

import { LoopwardenConfigError } from './errors.js';
import type { EvidenceValue, OutcomeReceipt, ReceiptKind } from './events.js';
import type { SinkRecord } from './sinks.js';

export interface ReceiptSignature {
  key_id: string;
  /** base64url (no padding) of the 64-byte Ed25519 signature over `receiptSigningBytes`. */
  sig: string;
}

export type SignedOutcomeReceipt = OutcomeReceipt & { signature?: ReceiptSignature };

export type CheckValue = EvidenceValue | Record<string, EvidenceValue>;

export interface OutcomeExpected {
  type: 'outcome_expected';
  run_id: string;
  ts: number;
  expectation_id: string;
  kind: ReceiptKind;
  /** `file:///…`, `https://…`, `postgresql://…#table` */
  target: string;
  checks: Record<string, CheckValue>;
}

/** Why a receipt does not count (null: a trusted key signed exactly this receipt). */
export type UntrustedWhy = 'unsigned' | 'unknown_key' | 'bad_signature' | 'not_canonical';

const MAX_SAFE = Number.MAX_SAFE_INTEGER;

function canonicalValue(value: unknown, path: string, forWire = false): string {
  if (value === null || typeof value === 'boolean' || typeof value === 'string') return JSON.stringify(value);
  if (typeof value === 'number') {
    if (!Number.isFinite(value)) throw new LoopwardenConfigError(`${path}: ${value} is not a finite number (no canonical form)`);
    // Sent, JSON.stringify writes an integer-valued number below 1e21 as digits, which Python reads
    // as an int: beyond 2**53 - 1 it has no canonical form there, so a signer refuses it.
    if (forWire && Number.isInteger(value) && Math.abs(value) > MAX_SAFE && Math.abs(value) < 1e21) {
      throw new LoopwardenConfigError(`${path}: integer ${value} is beyond ±(2**53 - 1) (no canonical form)`);
    }
    return JSON.stringify(value); // Number::toString, as RFC 8785 asks
  }
  if (Array.isArray(value)) return `[${value.map((v, i) => canonicalValue(v, `${path}[${i}]`, forWire)).join(',')}]`;
  if (typeof value === 'object') {
    // Array.prototype.sort compares UTF-16 code units: the order RFC 8785 asks for.
    const keys = Object.keys(value as object).filter((k) => (value as Record<string, unknown>)[k] !== undefined).sort();
    return `{${keys.map((k) => `${JSON.stringify(k)}:${canonicalValue((value as Record<string, unknown>)[k], `${path}.${k}`, forWire)}`).join(',')}}`;
  }
  throw new LoopwardenConfigError(`${path}: a ${typeof value} has no canonical JSON form`);
}

/**
 * RFC 8785 (JCS) text of a JSON value. `forWire`: also refuse integers beyond ±(2**53 - 1) that
 * JSON.stringify would write as digits (what a signer must not send; see loopwarden.codecs.canonical).
 */
export function canonicalize(value: unknown, forWire = false): string {
  return canonicalValue(value, '$', forWire);
}

/**
 * The bytes `signature.sig` signs: the receipt without `signature`, `evidence` defaulting to {},
 * `run_started_ts` (the occurrence of the run it answers) only when present.
 */
export function receiptSigningBytes(receipt: OutcomeReceipt): Buffer {
  return Buffer.from(
    canonicalize({
      type: 'outcome_receipt',
      run_id: receipt.run_id,
      ts: receipt.ts,
      receipt_id: receipt.receipt_id,
      kind: receipt.kind,
      verifier: receipt.verifier,
      verified: receipt.verified,
      evidence: receipt.evidence ?? {},
      run_started_ts: receipt.run_started_ts ?? undefined,
    }),
    'utf8',
  );
}

export interface SigningKey {
  keyId: string;
  privateKey: KeyObject;
}

/**
 * A signing key from the file `loopwarden keys new` writes (a `# key_id: …` line and a PKCS#8 PEM),
 * or from a PEM and a key id given separately.
 */
export function loadSigningKey(text: string, keyId?: string): SigningKey {
  const idLine = text.split('\n').find((line) => line.startsWith('# key_id: '));
  const id = keyId ?? idLine?.slice('# key_id: '.length).trim();
  if (!id) throw new LoopwardenConfigError('signing key: no key id (a "# key_id: …" line or the keyId argument)');
  const pem = text
    .split('\n')
    .filter((line) => !line.startsWith('#'))
    .join('\n');
  let privateKey: KeyObject;
  try {
    privateKey = createPrivateKey(pem);
  } catch (error) {
    throw new LoopwardenConfigError(`signing key ${JSON.stringify(id)}: not a PEM private key (${(error as Error).message})`);
  }
  if (privateKey.asymmetricKeyType !== 'ed25519') {
    throw new LoopwardenConfigError(`signing key ${JSON.stringify(id)}: an ${privateKey.asymmetricKeyType} key, not Ed25519`);
  }
  return { keyId: id, privateKey };
}

/** The receipt with `signature` set by `key` (any previous signature replaced). */
export function signReceipt(receipt: OutcomeReceipt, key: SigningKey): SignedOutcomeReceipt {
  const { signature: _old, ...unsigned } = receipt as SignedOutcomeReceipt;
  canonicalize(unsigned.evidence ?? {}, true);
  const sig = sign(null, receiptSigningBytes(unsigned), key.privateKey).toString('base64url');
  return { ...unsigned, evidence: unsigned.evidence ?? {}, signature: { key_id: key.keyId, sig } };
}

/** `KEY_ID=PUBLIC_KEY[,…]` (the LOOPWARDEN_TRUSTED_VERIFIERS format) as key id → public key. */
export function parseTrustedVerifiers(text: string): Map<string, KeyObject> {
  const keys = new Map<string, KeyObject>();
  for (const raw of text.split(',')) {
    const entry = raw.trim();
    if (!entry) continue;
    const at = entry.indexOf('=');
    const id = at < 0 ? '' : entry.slice(0, at).trim();
    const x = at < 0 ? '' : entry.slice(at + 1).trim();
    if (!/^[A-Za-z0-9._:@-]{1,200}$/.test(id)) throw new LoopwardenConfigError(`trusted verifiers: entry ${JSON.stringify(entry.slice(0, 80))} is not KEY_ID=PUBLIC_KEY`);
    if (!/^[A-Za-z0-9_-]{43}$/.test(x)) {
      throw new LoopwardenConfigError(`trusted verifiers: the public key of ${JSON.stringify(id)}, ${JSON.stringify(x.slice(0, 60))}, is not the base64url of a 32-byte Ed25519 public key`);
    }
    keys.set(id, createPublicKey({ key: { kty: 'OKP', crv: 'Ed25519', x }, format: 'jwk' }));
  }
  return keys;
}

/** Null when a trusted key signed exactly this receipt; else why it does not count. */
export function receiptTrust(receipt: SignedOutcomeReceipt, trusted: Map<string, KeyObject>): UntrustedWhy | null {
  const signature = receipt.signature;
  if (signature == null) return 'unsigned';
  const key = trusted.get(signature.key_id);
  if (key === undefined) return 'unknown_key';
  let payload: Buffer;
  try {
    payload = receiptSigningBytes(receipt);
  } catch {
    return 'not_canonical';
  }
  const sig = Buffer.from(signature.sig, 'base64url');
  if (sig.length !== 64 || sig.toString('base64url') !== signature.sig) return 'bad_signature';
  return verify(null, payload, key, sig) ? null : 'bad_signature';
}

export interface ExpectOutcomeInput {
  runId: string;
  expectationId: string;
  kind: ReceiptKind;
  target: string;
  checks?: Record<string, CheckValue>;
  ts?: number;
}

const KINDS: readonly ReceiptKind[] = ['file', 'record', 'message', 'deployment', 'analysis', 'other'];

/** An `outcome_expected` event, checked against the wire limits (a clear error naming the bad value). */
export function outcomeExpected(input: ExpectOutcomeInput): OutcomeExpected {
  const { runId, expectationId, kind, target } = input;
  if (typeof runId !== 'string' || runId.length < 1 || runId.length > 200) throw new LoopwardenConfigError(`runId must be 1–200 characters, got ${JSON.stringify(runId)}`);
  if (typeof expectationId !== 'string' || expectationId.length < 1 || expectationId.length > 200) {
    throw new LoopwardenConfigError(`expectationId must be 1–200 characters, got ${JSON.stringify(expectationId)}`);
  }
  if (!KINDS.includes(kind)) throw new LoopwardenConfigError(`kind must be one of ${KINDS.join(', ')}, got ${JSON.stringify(kind)}`);
  if (typeof target !== 'string' || !/^(file|https|postgresql|s3):\/\//.test(target) || target.length > 2000) {
    throw new LoopwardenConfigError(`target must be a file://, https://, postgresql:// or s3:// URI of <= 2000 characters, got ${JSON.stringify(String(target).slice(0, 100))}`);
  }
  const checks = input.checks ?? {};
  canonicalize(checks, true); // finite numbers, plain values only
  return { type: 'outcome_expected', run_id: runId, ts: input.ts ?? Date.now(), expectation_id: expectationId, kind, target, checks };
}

/** The sink record of an `outcome_expected` (keyed by run id, on the steps topic). */
export function outcomeExpectedRecord(input: ExpectOutcomeInput, stepsTopic = 'agent.steps'): SinkRecord {
  const event = outcomeExpected(input);
  return { topic: stepsTopic, key: event.run_id, value: JSON.stringify(event) };
}

/**
 * Declare what a run must produce: sends an `outcome_expected` through `lw`'s sink (the application
 * says it, never the model). Resolves once the sink took it.
 */
export async function expectOutcome(
  lw: { options: { sink: { send(records: readonly SinkRecord[]): Promise<void> } }; topics: { steps: string } },
  input: ExpectOutcomeInput,
): Promise<OutcomeExpected> {
  const record = outcomeExpectedRecord(input, lw.topics.steps);
  await lw.options.sink.send([record]);
  return JSON.parse(record.value) as OutcomeExpected;
}
