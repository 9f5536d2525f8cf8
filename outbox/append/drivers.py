"""The drivers an append runs through: one per kind of object a caller may hold.

Every append is one call of the append function (`call`), made through the caller's own
object so it begins or joins the caller's transaction the way that driver does: asyncpg's
pool (a transaction of its own) or connection; SQLAlchemy's session or connection through its
own `execute` (never the raw driver connection underneath, whose transaction SQLAlchemy has not
begun yet); psycopg's connection; Django's connection (a DB-API cursor). A `Driver` knows the
statement's paramstyle, how to run it, and whether an error it raised lost the connection (the
append's outcome is then unknown). `async_driver`/`sync_driver` pick the driver for an object.
Optional packages are never imported here unless the caller's object came from them
(`sys.modules`): the core needs asyncpg only, through `outbox.db`.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any, Protocol

from outbox import db
from outbox.append import call

__all__ = [
    "ASYNC_TYPES",
    "SYNC_TYPES",
    "AsyncDriver",
    "SyncDriver",
    "async_driver",
    "lost",
    "sync_driver",
]

Row = Sequence[Any] | None

ASYNC_TYPES = (
    "an asyncpg Pool or Connection, an SQLAlchemy AsyncConnection or AsyncSession, "
    "or a psycopg AsyncConnection"
)
SYNC_TYPES = (
    "a psycopg Connection, an SQLAlchemy Connection or Session, or Django's connection "
    "(django.db.connection; outbox.contrib.django.append uses it for you)"
)


class AsyncDriver(Protocol):
    """Runs the append's call through an async caller's object."""

    async def call(self, target: Any, values: Sequence[Any]) -> Row: ...

    def lost(self, exc: BaseException) -> bool: ...


class SyncDriver(Protocol):
    """Runs the append's call through a blocking caller's object."""

    def call(self, target: Any, values: Sequence[Any]) -> Row: ...

    def lost(self, exc: BaseException) -> bool: ...


# SQLSTATEs after which the session is gone (the server ended it, or the link broke).
_SESSION_ENDED = ("08", "57P01", "57P02", "57P03")


def lost(exc: BaseException) -> bool:
    """Whether a driver's error says the connection is gone: SQLAlchemy invalidated it, a
    DB-API OperationalError carries no SQLSTATE (the socket) or a session-ending one, or
    asyncpg's own classification says so (also under SQLAlchemy's asyncpg dialect)."""
    seen: BaseException | None = exc
    while seen is not None:
        if getattr(seen, "connection_invalidated", False):
            return True
        if type(seen).__name__ == "OperationalError":
            state = call.sqlstate(seen)
            return state is None or state.startswith(_SESSION_ENDED)
        if db.connection_lost(seen):
            return True
        orig = getattr(seen, "orig", None)
        seen = orig if isinstance(orig, BaseException) else seen.__cause__
    return False


class _Asyncpg:
    async def call(self, target: Any, values: Sequence[Any]) -> Row:
        async with db.acquire(target) as conn:
            row = await conn.fetchrow(call.statement("numeric"), *values)
        return None if row is None else tuple(row)

    def lost(self, exc: BaseException) -> bool:
        return db.connection_lost(exc)


class _AsyncSqlAlchemy:
    async def call(self, target: Any, values: Sequence[Any]) -> Row:
        from sqlalchemy import text

        result = await target.execute(text(call.statement("named")), call.named(values))
        return tuple(result.one())

    def lost(self, exc: BaseException) -> bool:
        return lost(exc)


class _AsyncPsycopg:
    async def call(self, target: Any, values: Sequence[Any]) -> Row:
        async with target.cursor() as cur:
            await cur.execute(call.statement("format"), values)
            row: Row = await cur.fetchone()
            return row

    def lost(self, exc: BaseException) -> bool:
        return lost(exc)


class _SqlAlchemy:
    def call(self, target: Any, values: Sequence[Any]) -> Row:
        from sqlalchemy import text

        return tuple(target.execute(text(call.statement("named")), call.named(values)).one())

    def lost(self, exc: BaseException) -> bool:
        return lost(exc)


class _DbApi:
    """A DB-API connection in `format` paramstyle: psycopg's, Django's."""

    def call(self, target: Any, values: Sequence[Any]) -> Row:
        with target.cursor() as cur:
            cur.execute(call.statement("format"), values)
            row: Row = cur.fetchone()
            return row

    def lost(self, exc: BaseException) -> bool:
        return lost(exc)


def _loaded(module: str) -> Any:
    """The module if something in this process imported it (then the caller's object may be
    one of its types); None otherwise, without importing it."""
    return sys.modules.get(module)


def async_driver(x: object) -> AsyncDriver | None:
    """The driver for an async caller's object, None when no driver takes it."""
    if db.is_executor(x):
        return _Asyncpg()
    sa = _loaded("sqlalchemy.ext.asyncio")
    if sa is not None and isinstance(x, sa.AsyncConnection | sa.AsyncSession):
        return _AsyncSqlAlchemy()
    pg = _loaded("psycopg")
    if pg is not None and isinstance(x, pg.AsyncConnection):
        return _AsyncPsycopg()
    return None


def sync_driver(x: object) -> SyncDriver | None:
    """The driver for a blocking caller's object, None when no driver takes it."""
    sa = _loaded("sqlalchemy.engine")
    orm = _loaded("sqlalchemy.orm")
    if (sa is not None and isinstance(x, sa.Connection)) or (
        orm is not None and isinstance(x, orm.Session)
    ):
        return _SqlAlchemy()
    pg = _loaded("psycopg")
    if pg is not None and isinstance(x, pg.Connection):
        return _DbApi()
    django = _loaded("django.db.backends.base.base")
    if django is not None and isinstance(x, django.BaseDatabaseWrapper):
        return _DbApi()
    return None
