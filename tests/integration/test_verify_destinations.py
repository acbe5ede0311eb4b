"""The verifier's checkers against real destinations: files, an HTTPS server with a test CA, PostgreSQL.

No mocks: the files are on disk, the HTTPS server is aiohttp with a CA made here, the database is
Debian's PostgreSQL started in a temporary directory. Each bad input of the issue gives a clear,
counted outcome: a ``verified: false`` receipt with a reason where the destination answered, no
receipt and a metric where it could not be asked or was not allowed.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from loopwarden.codecs import OutcomeExpected, decode_outcome_event, encode
from loopwarden.trust import SigningKey, TrustedVerifiers
from loopwarden.verify.checkers.http import ssl_context
from loopwarden.verify.config import Database, VerifyConfig
from loopwarden.verify.service import Verifier
from dev.destinations import PostgresCluster, endless, free_port, make_ca_and_server_cert, start_https

PDF = b"%PDF-1.7\n" + b"x" * 5000
REPORT_SCHEMA = {"type": "object", "required": ["summary", "sections"],
                 "properties": {"summary": {"type": "string"}, "sections": {"type": "array", "minItems": 2}}}


@pytest.fixture(scope="module")
def pg_ca(tmp_path_factory) -> tuple[Path, Path, Path]:
    """A throwaway CA and the certificate it signed for the test database (ca.pem, cert.pem, key.pem)."""
    return make_ca_and_server_cert(tmp_path_factory.mktemp("pg-tls"))


@pytest.fixture(scope="module")
def pg(pg_ca):
    """The database, offering TLS with a certificate the test CA signed."""
    cluster = PostgresCluster(tls=pg_ca[1:]).start()
    cluster.psql("CREATE TABLE invoices (id int PRIMARY KEY, status text, amount numeric, paid boolean);"
                 "INSERT INTO invoices VALUES (1, 'sent', 120.50, true), (2, 'draft', 99, false);"
                 "CREATE TABLE secrets (id int);")
    yield cluster
    cluster.stop()


def _exp(target: str, checks: dict, eid: str = "e1", kind: str = "file") -> OutcomeExpected:
    return OutcomeExpected(run_id="run-1", ts=1, expectation_id=eid, kind=kind, target=target, checks=checks)


async def _routes_server(tmp: Path):
    ca, cert, key = make_ca_and_server_cert(tmp)

    async def version(request):
        return web.json_response({"version": "1.4.2", "health": {"ok": True}}, headers={"X-Release": "r-77"})

    async def report(request):
        return web.Response(body=PDF, content_type="application/pdf")

    async def hang(request):
        await asyncio.sleep(3600)

    async def redirect(request):
        raise web.HTTPFound("https://elsewhere.invalid/x")

    async def analysis(request):
        return web.json_response({"summary": "s", "sections": [1, 2, 3]})

    routes = [web.get("/version", version), web.get("/report.pdf", report), web.get("/hang", hang),
              web.get("/big", endless), web.get("/redirect", redirect), web.get("/analysis.json", analysis)]
    runner, port = await start_https(routes, cert, key)
    return runner, port, ca


def _config(tmp: Path, port: int, ca: Path, pg: PostgresCluster | None = None, pg_ca: Path | None = None,
            **kw) -> VerifyConfig:
    out = tmp / "out"
    out.mkdir(exist_ok=True)
    schema = tmp / "report.schema.json"
    schema.write_text(json.dumps(REPORT_SCHEMA))
    dbs = ()
    if pg is not None:
        dbs = (Database(host="127.0.0.1", port=pg.port, dbname="postgres", user=pg.user, password_env="LW_TEST_PG_PW",
                        tables=("invoices",), sslrootcert=str(pg_ca) if pg_ca else None),
               Database(host="127.0.0.1", port=free_port(), dbname="postgres", user="x", tables=("t",)))  # nothing listens
    return VerifyConfig(file_prefixes=(str(out),), http_hosts=(f"localhost:{port}",), http_cafile=str(ca),
                        databases=dbs, json_schemas={"report-v1": str(schema)}, check_timeout_s=3.0,
                        max_body_bytes=1024 * 1024, retry_negative_s=0, retry_initial_s=0.05, **kw)


async def _verify_all(config: VerifyConfig, expectations: list[OutcomeExpected], window_s: float = 3.0):
    key = SigningKey.generate("dest-1")
    sent = []

    async def publish(r):
        sent.append(r)

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ssl_context(config.http_cafile))) as session:
        v = Verifier(config, key, publish, http_session=session)
        deadline = int(time.time() * 1000 + window_s * 1000)
        results = await asyncio.gather(*(v.verify_one(e, deadline) for e in expectations))
    return results, v, TrustedVerifiers.parse(key.setting)


def _count(v: Verifier, checker: str, outcome: str) -> float:
    return v.metrics.registry.get_sample_value("loopwarden_verify_checks_total", {"checker": checker, "outcome": outcome}) or 0


def test_a_directory_target_is_a_not_a_file_receipt_never_an_exception(tmp_path: Path) -> None:
    """A directory under the prefix, and the prefix itself: a signed verified=false receipt, reason not_a_file."""
    out = tmp_path / "out"
    (out / "reports").mkdir(parents=True)
    exps = [_exp(f"file://{out}/reports", {"min_size": 1}, "dir"), _exp(f"file://{out}/", {}, "prefix"),
            _exp(f"file://{out}/reports/", {"json_schema": "report-v1"}, "schema_dir")]
    schema = tmp_path / "report.schema.json"
    schema.write_text(json.dumps(REPORT_SCHEMA))
    config = VerifyConfig(file_prefixes=(str(out),), retry_negative_s=0, json_schemas={"report-v1": str(schema)})
    results, v, trusted = asyncio.run(_verify_all(config, exps))
    assert [(r.receipt_id, r.verified, r.evidence["reason"]) for r in results] == [
        ("dir", False, "not_a_file"), ("prefix", False, "not_a_file"), ("schema_dir", False, "not_a_file")]
    assert all(trusted.why_untrusted(r) is None for r in results)
    assert _count(v, "file", "error") == 0 and _count(v, "json_schema", "error") == 0


def test_a_directory_swapped_for_a_symlink_while_checks_run_never_gets_a_file_outside_measured(tmp_path: Path) -> None:
    """3,000 checks while a thread swaps a directory for a symlink to outside the prefix: 0 outside measurements."""
    import threading

    from loopwarden.verify.checkers import CheckError
    from loopwarden.verify.checkers.base import Context
    from loopwarden.verify.checkers.file import FileChecker

    out, outside = tmp_path / "out", tmp_path / "outside"
    (out / "d").mkdir(parents=True)
    outside.mkdir()
    (out / "d" / "f.txt").write_text("inside\n")
    (outside / "f.txt").write_text("the secret outside the prefix\n")
    secret_size = (outside / "f.txt").stat().st_size
    config = VerifyConfig(file_prefixes=(str(out),))
    ctx = Context(config=config, timeout_s=3.0, max_body_bytes=1 << 20)
    exp = _exp(f"file://{out}/d/f.txt", {"sha256": hashlib.sha256(b"the secret outside the prefix\n").hexdigest()})
    stop = threading.Event()

    def swap() -> None:
        while not stop.is_set():
            (out / "d").rename(out / "d.real")
            (out / "d").symlink_to(outside, target_is_directory=True)
            (out / "d").unlink()
            (out / "d.real").rename(out / "d")

    async def checks() -> dict:
        seen: dict = {}
        checker = FileChecker()
        for _ in range(3000):
            try:
                m = await checker.check(exp, ctx)
                key = "outside" if m.verified or m.evidence.get("size") == secret_size else (m.reason or "inside")
            except CheckError as exc:
                key = exc.reason
            seen[key] = seen.get(key, 0) + 1
        return seen

    thread = threading.Thread(target=swap)
    thread.start()
    try:
        seen = asyncio.run(checks())
    finally:
        stop.set()
        thread.join()
    assert "outside" not in seen, seen
    assert sum(seen.values()) == 3000 and seen.get("sha256_mismatch", 0) > 0, seen  # the inside file was measured


def test_file_checker_measures_size_hash_and_sniffed_type_and_refuses_paths_outside(tmp_path: Path) -> None:
    """Present/right → verified; small, wrong hash, wrong type, missing → false with reason; outside → refused."""
    async def main():
        runner, port, ca = await _routes_server(tmp_path)
        try:
            config = _config(tmp_path, port, ca)
            out = tmp_path / "out"
            (out / "report.pdf").write_bytes(PDF)
            (out / "notes.txt").write_text("hello\n")
            (tmp_path / "secret.txt").write_text("no")
            (out / "link").symlink_to(tmp_path / "secret.txt")
            (out / "inner").symlink_to(out / "notes.txt")  # a link inside the prefix: not followed either
            sha = hashlib.sha256(PDF).hexdigest()
            exps = [
                _exp(f"file://{out}/report.pdf", {"min_size": 1000, "sha256": sha, "content_type": "application/pdf"}, "ok"),
                _exp(f"file://{out}/report.pdf", {"min_size": 10_000}, "small"),
                _exp(f"file://{out}/report.pdf", {"sha256": "0" * 64}, "hash"),
                _exp(f"file://{out}/notes.txt", {"content_type": "application/pdf"}, "type"),
                _exp(f"file://{out}/absent.pdf", {}, "missing"),
                _exp(f"file://{tmp_path}/secret.txt", {}, "outside"),
                _exp(f"file://{out}/link", {}, "symlink_out"),
                _exp(f"file://{out}/../secret.txt", {}, "dotdot"),
                _exp(f"file://{out}/inner", {}, "symlink_in"),
                _exp(f"file://{out}/report.pdf", {"colour": "red"}, "unknown_check"),
            ]
            results, v, trusted = await _verify_all(config, exps)
        finally:
            await runner.cleanup()
        by_id = {e.expectation_id: r for e, r in zip(exps, results)}
        ok = by_id["ok"]
        assert ok.verified and ok.evidence["size"] == len(PDF) and ok.evidence["sha256"] == sha
        assert ok.evidence["content_type"] == "application/pdf" and trusted.why_untrusted(ok) is None
        assert ok.receipt_id == "ok" and ok.verifier == "destination"
        reasons = {k: r.evidence["reason"] for k, r in by_id.items() if r is not None and not r.verified}
        assert reasons == {"small": "size_below_floor", "hash": "sha256_mismatch", "type": "content_type_mismatch",
                           "missing": "missing"}
        assert [k for k, r in by_id.items() if r is None] == ["outside", "symlink_out", "dotdot", "symlink_in",
                                                              "unknown_check"]
        assert _count(v, "file", "refused") == 4 and _count(v, "file", "bad_expectation") == 1
        assert all(decode_outcome_event(encode(r)) == r for r in results if r is not None)
    asyncio.run(main())


def test_http_checker_status_header_json_pointer_hash_and_bounded_bad_destinations(tmp_path: Path) -> None:
    """HTTPS with the test CA: values checked; a 10 GB body is cut; a hang times out; others refused."""
    async def main():
        runner, port, ca = await _routes_server(tmp_path)
        base = f"https://localhost:{port}"
        try:
            config = _config(tmp_path, port, ca)
            exps = [
                _exp(f"{base}/version", {"status": 200, "json": {"/version": "1.4.2", "/health/ok": True},
                                         "header": {"X-Release": "r-77"}}, "deployed", "deployment"),
                _exp(f"{base}/version", {"json": {"/version": "1.5.0"}}, "old_version", "deployment"),
                _exp(f"{base}/report.pdf", {"sha256": hashlib.sha256(PDF).hexdigest(), "min_size": 100,
                                            "content_type": "application/pdf"}, "object"),
                _exp(f"{base}/nope", {}, "not_found"),
                _exp(f"{base}/redirect", {}, "redirect"),
                _exp(f"{base}/big", {"sha256": "0" * 64}, "ten_gb"),
                _exp(f"{base}/hang", {}, "hang"),
                _exp(f"https://127.0.0.1:{port}/version", {}, "ip_not_allowed"),
                _exp("https://169.254.169.254/latest/meta-data", {}, "ssrf"),
                _exp(f"http://localhost:{port}/version", {}, "plain_http"),
                _exp("ftp://example.com/x", {}, "unsupported"),
            ]
            t0 = time.monotonic()
            results, v, trusted = await _verify_all(config, exps, window_s=5.0)
            elapsed = time.monotonic() - t0
        finally:
            await runner.cleanup()
        by_id = {e.expectation_id: r for e, r in zip(exps, results)}
        assert by_id["deployed"].verified and by_id["deployed"].evidence["json:/version"] is True
        assert by_id["deployed"].evidence["header:x-release"] is True
        assert "1.4.2" not in json.dumps(by_id["deployed"].evidence) and "1.4.2" not in json.dumps(by_id["old_version"].evidence)
        assert by_id["old_version"].evidence["json:/version"] is False  # which pointer differs, no digest of its value
        assert not [k for k in by_id["old_version"].evidence if k.endswith(":sha256")]
        assert by_id["object"].verified and by_id["object"].evidence["size"] == len(PDF)
        reasons = {k: r.evidence["reason"] for k, r in by_id.items() if r is not None and not r.verified}
        assert reasons == {"old_version": "json_value_mismatch", "not_found": "status_mismatch",
                           "redirect": "status_mismatch", "ten_gb": "body_too_large"}
        assert by_id["ten_gb"].evidence["size_over"] == 1024 * 1024
        assert [k for k, r in by_id.items() if r is None] == ["hang", "ip_not_allowed", "ssrf", "plain_http", "unsupported"]
        assert _count(v, "http", "refused") == 3 and _count(v, "none", "unsupported") == 1
        assert _count(v, "http", "cannot_ask") >= 1  # the hang timed out (retried until the window closed)
        assert v.metrics.registry.get_sample_value("loopwarden_verify_gave_up_total", {"checker": "http", "reason": "timeout"}) >= 1
        assert elapsed < 40, "a hanging destination must not stall the verifier"
    asyncio.run(main())


def test_tls_is_verified_a_server_the_ca_did_not_sign_cannot_be_asked(tmp_path: Path) -> None:
    """With the system CAs instead of the test CA, the HTTPS server is not trusted: no receipt, counted."""
    async def main():
        runner, port, ca = await _routes_server(tmp_path)
        try:
            config = _config(tmp_path, port, ca)
            config = VerifyConfig(**{**config.__dict__, "http_cafile": None})
            results, v, _ = await _verify_all(config, [_exp(f"https://localhost:{port}/version", {}, "tls")], window_s=1.5)
        finally:
            await runner.cleanup()
        assert results == [None]
        assert v.metrics.registry.get_sample_value("loopwarden_verify_gave_up_total", {"checker": "http", "reason": "tls"}) == 1
    asyncio.run(main())


def test_json_schema_checker_validates_named_schemas_at_files_and_urls(tmp_path: Path) -> None:
    """A document with its required sections verifies; one without fails with where; unknown names refused."""
    async def main():
        runner, port, ca = await _routes_server(tmp_path)
        try:
            config = _config(tmp_path, port, ca)
            out = tmp_path / "out"
            (out / "good.json").write_text(json.dumps({"summary": "x", "sections": ["a", "b"]}))
            (out / "bad.json").write_text(json.dumps({"summary": "x", "sections": ["only one"]}))
            (out / "text.json").write_text("not json at all")
            exps = [
                _exp(f"file://{out}/good.json", {"json_schema": "report-v1"}, "good", "analysis"),
                _exp(f"file://{out}/bad.json", {"json_schema": "report-v1"}, "bad", "analysis"),
                _exp(f"file://{out}/text.json", {"json_schema": "report-v1"}, "text", "analysis"),
                _exp(f"https://localhost:{port}/analysis.json", {"json_schema": "report-v1"}, "url", "analysis"),
                _exp(f"file://{out}/good.json", {"json_schema": "no-such-schema"}, "unknown", "analysis"),
            ]
            results, v, _ = await _verify_all(config, exps)
        finally:
            await runner.cleanup()
        by_id = {e.expectation_id: r for e, r in zip(exps, results)}
        assert by_id["good"].verified and by_id["url"].verified and by_id["good"].evidence["errors"] == 0
        assert (by_id["bad"].verified, by_id["bad"].evidence["reason"], by_id["bad"].evidence["first_error_at"]) == (
            False, "schema_invalid", "$.sections")
        assert by_id["text"].evidence["reason"] == "not_json" and by_id["unknown"] is None
        assert _count(v, "json_schema", "bad_expectation") == 1
    asyncio.run(main())


def test_postgresql_checker_finds_the_row_compares_fields_and_never_copies_values(pg, pg_ca, tmp_path: Path,
                                                                                   monkeypatch) -> None:
    """Right row verified; a wrong field named, never its value nor a digest; unlisted tables refused."""
    monkeypatch.setenv("LW_TEST_PG_PW", pg.password)

    async def main():
        runner, port, ca = await _routes_server(tmp_path)
        try:
            config = _config(tmp_path, port, ca, pg, pg_ca[0])
            target = f"postgresql://127.0.0.1:{pg.port}/postgres#invoices"
            exps = [
                _exp(target, {"row": {"id": 1}, "fields": {"status": "sent", "amount": "120.50", "paid": True}}, "row_ok", "record"),
                _exp(target, {"row": {"id": 2}, "fields": {"status": "sent"}}, "row_wrong", "record"),
                _exp(target, {"row": {"id": 3}, "fields": {"status": "sent"}}, "row_missing", "record"),
                _exp(target, {"row": {"id": 1}, "fields": {"nope": "x"}}, "no_column", "record"),
                _exp(f"postgresql://127.0.0.1:{pg.port}/postgres#secrets", {"row": {"id": 1}}, "table_not_allowed", "record"),
                _exp(f"postgresql://127.0.0.1:{pg.port}/postgres#pg_catalog.pg_authid", {"row": {"rolname": "verifier"}},
                     "catalog", "record"),
                _exp(f"postgresql://127.0.0.1:{pg.port}/other#invoices", {"row": {"id": 1}}, "db_not_allowed", "record"),
                _exp(f"postgresql://evil:pw@127.0.0.1:{pg.port}/postgres#invoices", {"row": {"id": 1}}, "creds", "record"),
                _exp(f"postgresql://127.0.0.1:{config.databases[1].port}/postgres#t", {"row": {"id": 1}}, "refused", "record"),
                _exp(target, {"row": {"id": 1}, "fields": {"status; DROP TABLE invoices": "x"}}, "injection", "record"),
            ]
            results, v, _ = await _verify_all(config, exps, window_s=2.0)
        finally:
            await runner.cleanup()
        by_id = {e.expectation_id: r for e, r in zip(exps, results)}
        assert by_id["row_ok"].verified and by_id["row_ok"].evidence["field:status"] is True
        wrong = by_id["row_wrong"]
        assert (wrong.verified, wrong.evidence["reason"], wrong.evidence["field:status"]) == (False, "fields_mismatch", False)
        assert wrong.evidence == {"rows": 1, "field:status": False, "reason": "fields_mismatch",
                                  "checker_target": wrong.evidence["checker_target"]}
        assert "draft" not in json.dumps(wrong.evidence) and hashlib.sha256(b"draft").hexdigest()[:16] not in encode(wrong).decode()
        assert by_id["row_missing"].evidence["reason"] == "row_missing"
        assert by_id["no_column"].evidence["reason"] == "no_such_column"
        assert [k for k, r in by_id.items() if r is None] == ["table_not_allowed", "catalog", "db_not_allowed", "creds",
                                                              "refused", "injection"]
        assert _count(v, "postgresql", "refused") == 4 and _count(v, "postgresql", "bad_expectation") == 1
        assert v.metrics.registry.get_sample_value("loopwarden_verify_gave_up_total",
                                                   {"checker": "postgresql", "reason": "unreachable"}) == 1
        assert pg.psql("SELECT count(*) FROM invoices").strip() == "2"
    asyncio.run(main())


def _pg_config(cluster: PostgresCluster, **db) -> VerifyConfig:
    return VerifyConfig(databases=(Database(host="127.0.0.1", port=cluster.port, dbname="postgres", user=cluster.user,
                                            password_env="LW_TEST_PG_PW", tables=("invoices",), **db),),
                        check_timeout_s=3.0, retry_negative_s=0, retry_initial_s=0.05)


def _row_ok(cluster: PostgresCluster) -> OutcomeExpected:
    return _exp(f"postgresql://127.0.0.1:{cluster.port}/postgres#invoices", {"row": {"id": 1}, "fields": {"status": "sent"}},
                "row_ok", "record")


def _gave_up(v: Verifier, reason: str) -> float:
    return v.metrics.registry.get_sample_value("loopwarden_verify_gave_up_total",
                                               {"checker": "postgresql", "reason": reason}) or 0


def test_postgresql_is_asked_over_tls_verified_against_the_configured_ca_and_an_untrusted_server_cannot_answer(
        pg, pg_ca, tmp_path: Path, monkeypatch) -> None:
    """verify-full with the server's CA answers; with another CA or the system's: no receipt, counted as tls."""
    monkeypatch.setenv("LW_TEST_PG_PW", pg.password)
    other_ca = make_ca_and_server_cert(tmp_path)[0]
    results = {}
    for name, db in (("right_ca", {"sslrootcert": str(pg_ca[0])}), ("verify_ca", {"sslrootcert": str(pg_ca[0]),
                                                                                "sslmode": "verify-ca"}),
                     ("other_ca", {"sslrootcert": str(other_ca)}), ("system_cas", {})):
        (result,), v, trusted = asyncio.run(_verify_all(_pg_config(pg, **db), [_row_ok(pg)], window_s=1.5))
        results[name] = (result is not None and result.verified, _gave_up(v, "tls"))
    assert results == {"right_ca": (True, 0), "verify_ca": (True, 0), "other_ca": (False, 1), "system_cas": (False, 1)}


def test_postgresql_in_plaintext_only_when_the_config_says_sslmode_disable(tmp_path: Path, monkeypatch) -> None:
    """A server without TLS is refused by default (counted as tls) and asked only with sslmode = "disable"."""
    plain = PostgresCluster().start()
    try:
        plain.psql("CREATE TABLE invoices (id int PRIMARY KEY, status text); INSERT INTO invoices VALUES (1, 'sent');")
        monkeypatch.setenv("LW_TEST_PG_PW", plain.password)
        (refused,), v, _ = asyncio.run(_verify_all(_pg_config(plain), [_row_ok(plain)], window_s=1.5))
        assert refused is None and _gave_up(v, "tls") == 1
        (asked,), v, _ = asyncio.run(_verify_all(_pg_config(plain, sslmode="disable"), [_row_ok(plain)]))
        assert asked is not None and asked.verified and _gave_up(v, "tls") == 0
    finally:
        plain.stop()
