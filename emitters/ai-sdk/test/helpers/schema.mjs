// The lead's JSON Schema of all events (`loopwarden schema` → <repo>/schema/loopwarden.schema.json),
// compiled with ajv. A missing schema is a clear failure, never a skip.
import { existsSync, readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import Ajv2020 from 'ajv/dist/2020.js';
import Ajv from 'ajv';

export const SCHEMA_PATH = fileURLToPath(new URL('../../../../schema/loopwarden.schema.json', import.meta.url));
export const PYTHON_GOLDEN_PATH = fileURLToPath(new URL('../../../../tests/vectors/python-golden.jsonl', import.meta.url));

let compiled;

/** validate(event) → null when valid, else a readable error string. */
export function schemaValidator() {
  if (compiled) return compiled;
  if (!existsSync(SCHEMA_PATH)) {
    throw new Error(`${SCHEMA_PATH} is missing: generate it at the repo root with \`.venv/bin/loopwarden schema > schema/loopwarden.schema.json\``);
  }
  const schema = JSON.parse(readFileSync(SCHEMA_PATH, 'utf8'));
  // msgspec emits draft 2020-12 with an OpenAPI-style `discriminator`; ajv's own discriminator
  // keyword wants oneOf without mappings, so it is left as an annotation (strict: false).
  const is2020 = String(schema.$schema ?? '').includes('2020-12');
  const ajv = is2020 ? new Ajv2020.default({ strict: false, allErrors: true }) : new Ajv.default({ strict: false, allErrors: true });
  ajv.addSchema(schema, 'loopwarden');
  const validate = ajv.getSchema('loopwarden');
  const byType = new Map(
    Object.entries(schema.discriminator?.mapping ?? {}).map(([type, ref]) => [type, ajv.getSchema(`loopwarden${ref}`)]),
  );
  compiled = (event) => {
    if (validate(event)) return null;
    // Name the errors of the event's own type rather than of every branch of the union.
    const own = byType.get(event?.type);
    if (own && !own(event)) return `${event.type}: ${ajv.errorsText(own.errors, { separator: '; ' })}`;
    return ajv.errorsText(validate.errors, { separator: '; ' });
  };
  return compiled;
}

/** Same JSON value, whatever the key order or number formatting (300 vs 300.0). */
export function canonicalJson(value) {
  if (Array.isArray(value)) return `[${value.map(canonicalJson).join(',')}]`;
  if (value !== null && typeof value === 'object') {
    return `{${Object.keys(value)
      .sort()
      .map((k) => `${JSON.stringify(k)}:${canonicalJson(value[k])}`)
      .join(',')}}`;
  }
  return JSON.stringify(value);
}
