"""The driver: connections, pools, codecs, session settings, and what a driver error means.

This is the only module that imports asyncpg. Everything else receives an `Executor` (a pool
or a connection) and runs named queries on what `acquire` yields; it asks this module whether
an error lost the connection (`connection_lost`), says "try again" (`transient`), or is a
database error at all (`database_error`). It must never let a DSN password reach a message:
every error raised here is built from `redact_dsn` and `scrub`, never from `str()` of a driver
error that may echo the DSN.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager, suppress
from typing import TYPE_CHECKING, Any, TypeAlias, TypeGuard

import asyncpg
import orjson

from outbox.config import Session
from outbox.errors import DatabaseUnavailable
from outbox.obs import log
from outbox.queries import Queries
from outbox.redact import dsn_secrets, redact_dsn, scrub

if TYPE_CHECKING:
    from asyncpg.pool import PoolConnectionProxy

# Importable at run time (for users' annotations); generic only to the type checker.
Pool: TypeAlias = "asyncpg.Pool[asyncpg.Record]"
Connection: TypeAlias = "asyncpg.Connection[asyncpg.Record] | PoolConnectionProxy[asyncpg.Record]"
Executor: TypeAlias = "Pool | Connection"
Record: TypeAlias = asyncpg.Record

__all__ = [
    "Connection",
    "Executor",
    "Pool",
    "Record",
    "acquire",
    "affected",
    "connect",
    "connection_lost",
    "create_pool",
    "database_error",
    "dsn_secrets",
    "ensure_session",
    "in_transaction",
    "is_executor",
    "is_pool",
    "lock_not_available",
    "prune",
    "raw_connection",
    "redact_dsn",
    "scrub",
    "sqlstate_of",
    "transient",
    "write_refusal",
]

_logger = log.get_logger("outbox.db")


def _encode_jsonb(value: Any) -> bytes:
    return b"\x01" + orjson.dumps(value)


def _decode_jsonb(data: bytes) -> Any:
    return orjson.loads(data[1:])


class SessionQueries(Queries):
    apply_session_defaults: str
    apply_session_settings: str
    get_write_refusal: str


async def write_refusal(executor: Executor, *, session: bool = True) -> str | None:
    """Why `executor`'s session cannot write, None if it can: the server is a standby, or (with
    `session`) the session is read-only by default. A worker started there waits; `maintenance
    health` names a standby (a monitoring role may well be read-only by default)."""
    refusal: str | None = await executor.fetchval(SessionQueries.get_write_refusal, session)
    return refusal


async def ensure_session(conn: Connection, session: Session) -> None:
    """Apply `session` unless it is in effect: the server reports `application_name` on every
    change, so a connection still named ours kept our settings (a pool's `RESET ALL` on release
    resets the name too). Free on the worker's own pools, one statement after a reset."""
    if conn.get_settings().application_name == session.application_name:
        return
    names = ["application_name", *session.explicit, *session.fallback]
    values = [session.application_name, *session.explicit.values(), *session.fallback.values()]
    flags = [False] * (1 + len(session.explicit)) + [True] * len(session.fallback)
    await conn.fetch(SessionQueries.apply_session_settings, names, values, flags)


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
        f"cannot connect to {target} ({type(exc).__name__}: {scrub(str(exc), dsn)})",
        transient=transient(exc),
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


def is_pool(executor: object) -> TypeGuard[Pool]:
    """Whether `executor` is a pool (each statement on its own connection and transaction)."""
    return isinstance(executor, asyncpg.Pool)


def is_executor(x: object) -> TypeGuard[Executor]:
    """Whether `x` is an asyncpg pool or connection (a pool's proxy included)."""
    from asyncpg.pool import PoolConnectionProxy

    return isinstance(x, asyncpg.Pool | asyncpg.Connection | PoolConnectionProxy)


def require_asyncpg(executor: object, what: str) -> None:
    """Refuse, as a one-line TypeError naming what to pass, an object that is not an asyncpg
    pool or connection (an SQLAlchemy engine or session, a psycopg pool): `what` needs
    asyncpg's LISTEN, which those do not expose in a form the outbox can use."""
    if is_executor(executor):
        return
    kind = f"{type(executor).__module__}.{type(executor).__qualname__}"
    raise TypeError(
        f"{what} takes an asyncpg Pool or Connection, not {kind}: open a small pool of its own "
        "beside your engine with outbox.create_pool(dsn) (docs/worker.md, pool sizing)"
    )


def in_transaction(executor: Executor) -> bool:
    """Whether `executor` is a connection inside an open transaction (a pool never is)."""
    return not isinstance(executor, asyncpg.Pool) and executor.is_in_transaction()


@asynccontextmanager
async def acquire(
    executor: Executor, *, session: Session | None = None
) -> AsyncIterator[Connection]:
    """Yield a connection: the executor itself, or one borrowed from the pool for the block
    (with `session` in effect on it, whoever made the pool: `ensure_session`).

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
        if session is not None:
            await ensure_session(conn, session)
        yield conn
    except BaseException as exc:
        # A connection that closed (the server ended it) has already gone back to the pool,
        # which detached our proxy: nothing is left to terminate.
        with suppress(asyncpg.InterfaceError):
            if connection_lost(exc) or conn.is_closed():
                conn.terminate()
        await _release(executor, conn, exc)
        raise
    await _release(executor, conn, None)


def raw_connection(conn: Connection) -> asyncpg.Connection[asyncpg.Record]:
    """The driver's connection under `conn` (a pool hands out a new proxy per acquire): what
    per-connection caches key on."""
    from asyncpg.pool import PoolConnectionProxy

    if isinstance(conn, PoolConnectionProxy):
        raw: asyncpg.Connection[asyncpg.Record] = conn._con  # type: ignore[attr-defined]
        return raw
    return conn


def affected(status: str) -> int:
    """The rows a command's status line says it touched (`DELETE 3` -> 3)."""
    return int(status.rsplit(" ", 1)[-1])


async def prune(conn: Connection, query: str, *args: object, batch: int) -> int:
    """Run a bounded DELETE (its last argument is the `batch`) until it removes fewer rows
    than a batch: short transactions, short locks. Returns how many rows went."""
    total = 0
    while True:
        status = await conn.execute(query, *args, batch)
        removed = affected(status)
        total += removed
        if removed < batch:
            return total


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


# -- What a driver error means ---------------------------------------------------------------

# The settle's: a projector was recorded that the batch did not know (a rolling deploy).
PROJECTORS_CHANGED = "OB024"
UNIQUE_VIOLATION = "23505"
# SQLSTATEs that say "try again" about the session or the moment, not about the statement's
# data: the same statement can succeed on another attempt.
_TRANSIENT_SQLSTATES = {
    "40001",  # serialization_failure
    "40P01",  # deadlock_detected
    "55P03",  # lock_not_available (lock_timeout)
    "57014",  # query_canceled (statement_timeout)
    "57P01",  # admin_shutdown
    "57P02",  # crash_shutdown
    "57P03",  # cannot_connect_now
    "53300",  # too_many_connections
    "25P03",  # idle_in_transaction_session_timeout
    "25006",  # read_only_sql_transaction: a standby, or a primary demoted under us
    PROJECTORS_CHANGED,
}
_CONNECTION_CLASSES = ("08",)  # connection_exception and its kin
# SQLSTATEs after which the session is gone or of no use: the server ends it, never gave it
# (starting up, no free slot), or it is read-only. A read-only session stays so (a standby, a
# role's default_transaction_read_only): a new connection is the way out, and a multi-host DSN
# with target_session_attrs=read-write finds the primary.
_SESSION_ENDING_SQLSTATES = {"57P01", "57P02", "57P03", "25P03", "53300", "25006"}

# InterfaceErrors that describe a query's arguments or the client, not the connection: a
# projector passing a string for an integer is a failure of its event, not a lost connection.
_NOT_CONNECTION_ERRORS = (
    asyncpg.exceptions.DataError,
    asyncpg.exceptions.ClientConfigurationError,
    asyncpg.exceptions.UnsupportedClientFeatureError,
    asyncpg.exceptions.UnsupportedServerFeatureError,
)


def sqlstate_of(exc: BaseException) -> str | None:
    """The SQLSTATE a server error carries (None for client-side errors)."""
    if isinstance(exc, asyncpg.PostgresError):
        return getattr(exc, "sqlstate", None) or None
    return None


def connection_lost(exc: BaseException) -> bool:
    """Whether `exc` says the connection it came from is unusable: the socket is gone, the
    server ended the session, or the driver's protocol state is broken. asyncpg raises
    `InternalClientError` ("cannot switch to state ...; another operation is in progress")
    when a connection whose backend was terminated mid-statement is reset or released
    (MagicStack/asyncpg#784): that is a lost connection too, never a projector's failure."""
    if isinstance(exc, _NOT_CONNECTION_ERRORS):
        return False  # bad arguments or features: the caller's mistake, not the connection
    if isinstance(exc, asyncpg.InternalClientError | asyncpg.InterfaceError):
        return True
    state = sqlstate_of(exc)
    if state is not None:
        return state.startswith(_CONNECTION_CLASSES) or state in _SESSION_ENDING_SQLSTATES
    if isinstance(exc, ConnectionError | TimeoutError):
        return True
    return isinstance(exc, OSError) and not isinstance(exc, FileNotFoundError | PermissionError)


def transient(exc: BaseException) -> bool:
    """Whether the same work may succeed if tried again later: a lost connection, or a
    SQLSTATE about the session or the moment (deadlock, serialization, lock or statement
    timeout, shutdown, too many connections)."""
    return connection_lost(exc) or sqlstate_of(exc) in _TRANSIENT_SQLSTATES


def lock_not_available(exc: BaseException) -> bool:
    """Whether a NOWAIT lock found the row held (SQLSTATE 55P03)."""
    return isinstance(exc, asyncpg.LockNotAvailableError)


def missing_object(exc: BaseException) -> bool:
    """Whether `exc` says a table, schema or function the statement named does not exist:
    on an outbox install, a database not migrated (or not to this release)."""
    missing = (
        asyncpg.UndefinedTableError,
        asyncpg.InvalidSchemaNameError,
        asyncpg.UndefinedFunctionError,
    )
    return isinstance(exc, missing)


def database_error(exc: BaseException) -> bool:
    """Whether `exc` came from the server or the driver (not from the caller's own code)."""
    return isinstance(exc, asyncpg.PostgresError | asyncpg.InterfaceError)
