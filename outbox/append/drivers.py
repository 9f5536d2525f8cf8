"""The append function's call through each driver, on the caller's own object.

The statement goes through what the caller holds (an SQLAlchemy session or connection, a
psycopg connection, Django's connection), so it begins or joins the caller's transaction the
way that driver does: with SQLAlchemy, the session's own `execute`, never the raw driver
connection underneath (whose transaction SQLAlchemy has not begun yet). Optional packages are
never imported here unless the caller's object came from them (`sys.modules`): the core needs
asyncpg only. asyncpg itself goes through `outbox.append.journal`.

Each `run_*` returns the function's row; `lost()` says whether a driver's error lost the
connection (the append's outcome is then unknown).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any, Literal

from outbox import db
from outbox.append import call

__all__ = [
    "ASYNC_TYPES",
    "SYNC_TYPES",
    "async_kind",
    "lost",
    "run_async",
    "run_sync",
    "sync_kind",
]

AsyncKind = Literal["sqlalchemy", "psycopg"]
SyncKind = Literal["sqlalchemy", "psycopg", "django"]

ASYNC_TYPES = (
    "an asyncpg Pool or Connection, an SQLAlchemy AsyncConnection or AsyncSession, "
    "or a psycopg AsyncConnection"
)
SYNC_TYPES = (
    "a psycopg Connection, an SQLAlchemy Connection or Session, or Django's connection "
    "(django.db.connection; outbox.contrib.django.append uses it for you)"
)


def _loaded(module: str) -> Any:
    """The module if something in this process imported it (then the caller's object may be
    one of its types); None otherwise, without importing it."""
    return sys.modules.get(module)


def async_kind(x: object) -> AsyncKind | None:
    """Which driver an async caller's object belongs to (asyncpg is the caller's own path)."""
    sa = _loaded("sqlalchemy.ext.asyncio")
    if sa is not None and isinstance(x, sa.AsyncConnection | sa.AsyncSession):
        return "sqlalchemy"
    pg = _loaded("psycopg")
    if pg is not None and isinstance(x, pg.AsyncConnection):
        return "psycopg"
    return None


def sync_kind(x: object) -> SyncKind | None:
    sa = _loaded("sqlalchemy.engine")
    orm = _loaded("sqlalchemy.orm")
    if (sa is not None and isinstance(x, sa.Connection)) or (
        orm is not None and isinstance(x, orm.Session)
    ):
        return "sqlalchemy"
    pg = _loaded("psycopg")
    if pg is not None and isinstance(x, pg.Connection):
        return "psycopg"
    django = _loaded("django.db.backends.base.base")
    if django is not None and isinstance(x, django.BaseDatabaseWrapper):
        return "django"
    return None


async def run_async(kind: AsyncKind, x: Any, values: Sequence[Any]) -> Sequence[Any] | None:
    """The function's row, through the caller's SQLAlchemy or psycopg async object."""
    if kind == "sqlalchemy":
        from sqlalchemy import text

        result = await x.execute(text(call.STATEMENT_NAMED), call.named(values))
        return tuple(result.one())
    async with x.cursor() as cur:
        await cur.execute(call.STATEMENT_PYFORMAT, values)
        row: Sequence[Any] | None = await cur.fetchone()
        return row


def run_sync(kind: SyncKind, x: Any, values: Sequence[Any]) -> Sequence[Any] | None:
    """The function's row, through the caller's SQLAlchemy, psycopg or Django object."""
    if kind == "sqlalchemy":
        from sqlalchemy import text

        return tuple(x.execute(text(call.STATEMENT_NAMED), call.named(values)).one())
    with x.cursor() as cur:
        cur.execute(call.STATEMENT_PYFORMAT, values)
        row: Sequence[Any] | None = cur.fetchone()
        return row


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
