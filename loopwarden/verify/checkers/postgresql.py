"""``postgresql``: a row found by key whose named fields equal the expected values.

Target ``postgresql://HOST:PORT/DBNAME#TABLE`` (``TABLE`` may be ``schema.table``). The database must
be one of ``postgresql.databases`` and the table one of its ``tables``; the user and the password come
from that entry (its ``password_env``), never from the event. The connection is TLS with the server's
certificate verified (the entry's ``sslmode``: ``verify-full`` unless it says ``verify-ca``, or
``disable`` for plaintext), so nobody on the path can answer in the database's place. Checks: ``row``
({key column: value}, required) and ``fields`` ({column: expected value}). Values are compared as
PostgreSQL's text form of the column (``true``/``false`` for booleans) and never leave the verifier:
evidence says which fields matched (``field:<column>``: true/false), never a value nor a digest of one
(a digest of a low-entropy value, a status or an amount, is the value to anyone who tries the few
candidates).
"""

from __future__ import annotations

import asyncio
import re
import ssl
from functools import lru_cache
from urllib.parse import unquote, urlsplit

from loopwarden.codecs import OutcomeExpected
from loopwarden.verify.checkers.base import (
    BadExpectation, CannotAsk, Context, Measured, NotAllowed, known_checks, mapping,
)

_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")


def _quoted(name: str, what: str) -> str:
    parts = name.split(".")
    if len(parts) > 2 or not all(_IDENT.match(p) for p in parts):
        raise BadExpectation("bad_check", f"{what} {name[:100]!r} is not an identifier ([A-Za-z_][A-Za-z0-9_]*)")
    return ".".join(f'"{p}"' for p in parts)


@lru_cache(maxsize=64)
def _tls(sslmode: str, sslrootcert: str | None) -> ssl.SSLContext | bool:
    """asyncpg's ``ssl`` argument for a database entry: a verifying context, or False (``disable``)."""
    if sslmode == "disable":
        return False
    context = ssl.create_default_context(cafile=sslrootcert)
    context.check_hostname = sslmode == "verify-full"  # verify-ca: the chain, not the name
    return context


def _text(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


class PostgresqlChecker:
    name = "postgresql"
    CHECKS = ("row", "fields")

    def accepts(self, expectation: OutcomeExpected) -> bool:
        return expectation.target.startswith(("postgresql:", "postgres:"))

    async def check(self, expectation: OutcomeExpected, ctx: Context) -> Measured:
        import asyncpg

        checks = expectation.checks
        known_checks(checks, self.CHECKS, self.name)
        key, fields = mapping(checks, "row"), mapping(checks, "fields")
        if not key:
            raise BadExpectation("bad_check", "check 'row' must name the key column(s) and value(s) of the row")
        try:
            parts = urlsplit(expectation.target)
            host, port = (parts.hostname or "").lower(), parts.port or 5432
        except ValueError:
            raise BadExpectation("bad_target", f"target {expectation.target[:200]!r} is not a URL") from None
        if parts.username or parts.password:
            raise NotAllowed("credentials_in_url", "target carries credentials: they come from the verifier's config only")
        dbname, table = unquote(parts.path.lstrip("/")), unquote(parts.fragment)
        db = ctx.config.database(host, port, dbname)
        if db is None:
            raise NotAllowed("outside_allow_list", f"database {host}:{port}/{dbname[:100]} is not in postgresql.databases")
        if table not in db.tables:
            raise NotAllowed("outside_allow_list", f"table {table[:100]!r} is not in the tables of {host}:{port}/{dbname}")
        qtable = _quoted(table, "table")
        cols = list(fields)
        select = ", ".join(f"{_quoted(c, 'field')}::text" for c in cols) or "1"
        where = " AND ".join(f"{_quoted(k, 'key column')}::text = ${i + 1}" for i, k in enumerate(key))
        sql = f"SELECT {select} FROM {qtable} WHERE {where} LIMIT 2"
        try:
            conn = await asyncpg.connect(host=db.host, port=db.port, user=db.user, password=db.password,
                                         database=db.dbname, timeout=ctx.timeout_s,
                                         ssl=_tls(db.sslmode, db.sslrootcert))
        except ssl.SSLError as exc:  # the server's certificate is not one the entry trusts
            raise CannotAsk("tls", f"{host}:{port}/{dbname}: TLS ({db.sslmode}): {exc}") from None
        except ConnectionError as exc:
            if db.sslmode != "disable" and "SSL" in str(exc):  # the server offers no TLS: never fall back
                raise CannotAsk("tls", f"{host}:{port}/{dbname}: the server refused TLS (sslmode {db.sslmode}; "
                                "plaintext only with sslmode = \"disable\")") from None
            raise CannotAsk("unreachable", f"{host}:{port}/{dbname}: cannot connect: {type(exc).__name__}: {exc}") from None
        except (OSError, asyncio.TimeoutError) as exc:
            raise CannotAsk("unreachable", f"{host}:{port}/{dbname}: cannot connect: {type(exc).__name__}: {exc}") from None
        except asyncpg.InvalidAuthorizationSpecificationError as exc:
            raise CannotAsk("auth_failed", f"{host}:{port}/{dbname}: {exc}") from None
        except asyncpg.PostgresError as exc:
            raise CannotAsk("unreachable", f"{host}:{port}/{dbname}: {type(exc).__name__}: {exc}") from None
        try:
            rows = await conn.fetch(sql, *[_text(v) for v in key.values()], timeout=ctx.timeout_s)
        except asyncpg.UndefinedTableError:
            return Measured(False, {}, "no_such_table")
        except asyncpg.UndefinedColumnError:
            return Measured(False, {}, "no_such_column")
        except asyncio.TimeoutError:
            raise CannotAsk("timeout", f"{host}:{port}/{dbname}: query took longer than {ctx.timeout_s} s") from None
        except asyncpg.PostgresError as exc:
            raise CannotAsk("query_failed", f"{host}:{port}/{dbname}: {type(exc).__name__}: {exc}") from None
        finally:
            await conn.close(timeout=ctx.timeout_s)
        if not rows:
            return Measured(False, {"rows": 0}, "row_missing")
        if len(rows) > 1:
            return Measured(False, {"rows": 2}, "row_ambiguous")
        evidence: dict = {"rows": 1}
        wrong = []
        for i, col in enumerate(cols):
            got = rows[0][i]
            ok = got == _text(fields[col])
            evidence[f"field:{col[:60]}"] = ok
            if not ok:
                wrong.append(col)
        if wrong:
            return Measured(False, evidence, "fields_mismatch")
        return Measured(True, evidence)
