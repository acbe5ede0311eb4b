"""``json_schema``: a JSON document at a file or https URL validates against a named schema.

The "analysis has its required sections and machine-readable output" case. The target follows
the ``file`` or ``http`` checker's allow-lists; ``checks.json_schema`` names a schema of the
verifier's ``[json_schemas]`` table (never a schema sent in the event). Evidence: size, sha256,
valid, the count of errors and the JSON path of the first one (a location, not content).
"""

from __future__ import annotations

import asyncio
import json
import time
from functools import lru_cache
from pathlib import Path

from loopwarden.codecs import OutcomeExpected
from loopwarden.verify.checkers.base import BadExpectation, Context, Measured, known_checks, scalar
from loopwarden.verify.checkers.file import local_path, read_measure
from loopwarden.verify.checkers.http import fetch


@lru_cache(maxsize=64)
def _validator(path: str):
    import jsonschema

    schema = json.loads(Path(path).read_text())
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


class JsonSchemaChecker:
    name = "json_schema"
    CHECKS = ("json_schema",)

    def accepts(self, expectation: OutcomeExpected) -> bool:
        return "json_schema" in expectation.checks

    async def check(self, expectation: OutcomeExpected, ctx: Context) -> Measured:
        checks = expectation.checks
        known_checks(checks, self.CHECKS, self.name)
        name = scalar(checks, "json_schema", str)
        path = ctx.config.json_schemas.get(name)
        if path is None:
            raise BadExpectation("unknown_schema", f"json_schema {name!r} is not in the verifier's [json_schemas]")
        target = expectation.target
        if target.startswith("file:"):
            where = local_path(target, ctx)
            m = await asyncio.to_thread(read_measure, where, True, time.monotonic() + ctx.timeout_s, ctx.max_body_bytes)
            if not m["exists"]:
                return Measured(False, {}, "missing")
            if not m["regular"]:
                return Measured(False, {}, "not_a_file")
            if m["whole"] is None:  # larger than the parse limit
                return Measured(False, {"size": m["size"]}, "document_too_large")
            body, size, sha = m["whole"], m["size"], m["sha256"]
        else:
            status, _headers, size, sha, body, cut = await fetch(target, ctx, min(ctx.max_body_bytes, 4 * 1024 * 1024))
            if cut:
                return Measured(False, {"status": status, "size_over": min(ctx.max_body_bytes, 4 * 1024 * 1024)},
                                "document_too_large")
            if status != 200:
                return Measured(False, {"status": status}, "status_mismatch")
        evidence: dict = {"size": size, "sha256": sha}
        try:
            doc = json.loads(body)
        except (ValueError, RecursionError):
            evidence["valid"] = False
            return Measured(False, evidence, "not_json")
        errors = sorted(_validator(path).iter_errors(doc), key=lambda e: list(e.absolute_path))
        evidence["valid"] = not errors
        evidence["errors"] = len(errors)
        if errors:
            evidence["first_error_at"] = ("$" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}"
                                                        for p in errors[0].absolute_path))[:200]
            return Measured(False, evidence, "schema_invalid")
        return Measured(True, evidence)
