"""Connections, pools, codecs, session settings and DSN redaction.

This is the only module that knows asyncpg's connection API. Everything else receives an
`Executor` (a pool or a connection) and runs named queries on what `acquire` yields.
It must never let a DSN password reach a message: every error raised here is built from
`redact_dsn` and `scrub`, never from `str()` of a driver error that may echo the DSN.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, TypeAlias

import asyncpg
import orjson

from outbox import log
from outbox.errors import DatabaseUnavailable
from outbox.queries import Queries
from outbox.redact import dsn_secrets, redact_dsn, scrub
from outbox.retry import connection_lost

if TYPE_CHECKING:
    from asyncpg.pool import PoolConnectionProxy

# Importable at run time (for users' annotations); generic only to the type checker.
Pool: TypeAlias = "asyncpg.Pool[asyncpg.Record]"
Connection: TypeAlias = "asyncpg.Connection[asyncpg.Record] | PoolConnectionProxy[asyncpg.Record]"
Executor: TypeAlias = "Pool | Connection"

__all__ = [
    "Connection",
    "Executor",
    "Pool",
    "acquire",
    "connect",
    "create_pool",
    "dsn_secrets",
    "redact_dsn",
    "scrub",
]

_logger = log.get_logger("outbox.db")


def _encode_jsonb(value: Any) -> bytes:
    return b"\x01" + orjson.dumps(value)


def _decode_jsonb(data: bytes) -> Any:
    return orjson.loads(data[1:])


class SessionQueries(Queries, file="session.sql"):
    apply_session_defaults: str


async def apply_session_defaults(conn: Connection, defaults: Mapping[str, str]) -> None:
    """Set `defaults` (PostgreSQL parameter -> value) where the server gives no value."""
    if defaults:
        await conn.fetch(
            SessionQueries.apply_session_defaults, list(defaults), list(defaults.values())
        )


async def init_connection(conn: Connection) -> None:
    """Per-connection set-up: orjson as the jsonb/json codec."""
    await conn.set_type_codec(
        "jsonb",
        schema="pg_catalog",
        encoder=_encode_jsonb,
        decoder=_decode_jsonb,
        format="binary",
    )
    await conn.set_type_codec(
        "json",
        schema="pg_catalog",
        encoder=lambda v: orjson.dumps(v).decode(),
        decoder=orjson.loads,
        format="text",
    )


# Everything asyncpg and the OS raise while a connection is being established.
_CONNECT_ERRORS = (OSError, TimeoutError, ValueError, asyncpg.PostgresError, asyncpg.InterfaceError)


def _unavailable(dsn: str | None, exc: BaseException) -> DatabaseUnavailable:
    target = redact_dsn(dsn) if dsn else "the database (libpq defaults)"
    # The target stands before a space: a redacted `password=***` runs to whitespace.
    return DatabaseUnavailable(
        f"cannot connect to {target} ({type(exc).__name__}: {scrub(str(exc), dsn)})"
    )


def _remember_secrets(dsn: str | None) -> str | None:
    """Teach the log formatter this DSN's password, so no log line can ever carry it."""
    log.add_secrets(dsn_secrets(dsn))
    return dsn


async def connect(
    dsn: str | None,
    *,
    server_settings: Mapping[str, str] | None = None,
    connect_timeout: float = 10.0,
    codecs: bool = True,
) -> asyncpg.Connection[asyncpg.Record]:
    """One connection with the codecs set; failures become a redacted DatabaseUnavailable."""
    dsn = _remember_secrets(dsn)
    try:
        conn: asyncpg.Connection[asyncpg.Record] = await asyncpg.connect(
            dsn, timeout=connect_timeout, server_settings=dict(server_settings or {})
        )
    except _CONNECT_ERRORS as exc:
        raise _unavailable(dsn, exc) from None
    if codecs:
        await init_connection(conn)
    return conn


async def create_pool(
    dsn: str | None,
    *,
    min_size: int = 1,
    max_size: int = 10,
    server_settings: Mapping[str, str] | None = None,
    session_defaults: Mapping[str, str] | None = None,
    connect_timeout: float = 10.0,
) -> Pool:
    """A pool whose connections carry the codecs; failures become DatabaseUnavailable.

    `server_settings` are sent at connect and override the server's own values;
    `session_defaults` apply only where the server gives none (`apply_session_defaults`), and
    then the pool's reset on release only ends an open transaction, so they last (and a
    release costs no round trip): such a pool's users must not leave session state behind
    (a projector's plain SET, LISTEN or session advisory lock).
    """
    dsn = _remember_secrets(dsn)
    defaults = dict(session_defaults or {})

    async def init(conn: Connection) -> None:
        await init_connection(conn)
        await apply_session_defaults(conn, defaults)

    async def keep_session(conn: Connection) -> None:
        # asyncpg's default reset ends with RESET ALL, which would drop the session defaults
        # set above after the first release (a frozen worker would then hold its rows).
        # Nothing else in a worker session changes its state outside a transaction.
        if conn.is_in_transaction():
            await conn.execute("ROLLBACK")

    try:
        pool = await asyncpg.create_pool(
            dsn,
            min_size=min_size,
            max_size=max_size,
            timeout=connect_timeout,
            init=init,
            reset=keep_session if defaults else None,
            server_settings=dict(server_settings or {}),
        )
    except _CONNECT_ERRORS as exc:
        raise _unavailable(dsn, exc) from None
    return pool


@asynccontextmanager
async def acquire(executor: Executor) -> AsyncIterator[Connection]:
    """Yield a connection: the executor itself, or one borrowed from the pool for the block.

    A borrowed connection that a lost-connection error came out of is terminated before it goes
    back, so the pool never hands out (or tries to reset) a broken one; a failure while handing
    it back (asyncpg#784's InternalClientError among them) discards it and is logged, never
    raised over the block's own outcome. The pool opens a fresh connection on the next acquire.
    """
    if not isinstance(executor, asyncpg.Pool):
        yield executor
        return
    conn = await executor.acquire()
    try:
        yield conn
    except BaseException as exc:
        if connection_lost(exc) or conn.is_closed():
            conn.terminate()
        await _release(executor, conn, exc)
        raise
    await _release(executor, conn, None)


async def _release(pool: Pool, conn: Connection, raised: BaseException | None) -> None:
    try:
        await pool.release(conn)  # type: ignore[arg-type]
    except Exception as exc:  # asyncpg terminated the connection before raising
        _logger.warning(
            "connection.discarded",
            extra={
                "error": scrub(f"{type(exc).__name__}: {exc}", None),
                "after": type(raised).__name__ if raised is not None else None,
            },
        )
