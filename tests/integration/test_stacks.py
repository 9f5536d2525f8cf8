"""The append in the caller's own transaction, from every stack it supports: asyncpg,
SQLAlchemy (async session and connection on asyncpg; sync session and connection on psycopg)
and psycopg (async and sync). Django's runs as a subprocess with its own settings
(test_django.py).

For each: a commit keeps the caller's row and the events, a rollback drops both, the append as
the first statement of the caller's transaction rolls back with it (SQLAlchemy begins its
transaction lazily: an append that went around the session would commit on its own), a keyed
retry returns the first result, and a refusal leaves the transaction usable.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import anyio
import psycopg
import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session

import outbox
from helpers import counts, journal_seqs
from outbox import Event, Settings, db

DOMAIN = "CREATE TABLE domain_rows (id text PRIMARY KEY)"


class Rollback(Exception):
    """Raised inside a unit of work to roll it back."""


# One unit of work: `write(tx)` the caller's own row, `append(tx, ...)` through the stack.
Unit = Callable[[Any], Coroutine[Any, Any, Any]]


@dataclass
class Stack:
    name: str
    # Runs `body(tx, domain_write)` in one transaction of this stack, committing at the end.
    transaction: Callable[[str, Unit], Awaitable[Any]]


def url(dsn: str, driver: str) -> str:
    return dsn.replace("postgresql://", f"postgresql+{driver}://", 1)


async def via_asyncpg(dsn: str, body: Unit) -> Any:
    conn = await db.connect(dsn)
    try:
        async with conn.transaction():
            return await body(conn)
    finally:
        await conn.close()


async def via_sqlalchemy_session(dsn: str, body: Unit) -> Any:
    engine = create_async_engine(url(dsn, "asyncpg"))
    try:
        async with AsyncSession(engine) as session, session.begin():
            return await body(session)
    finally:
        await engine.dispose()


async def via_sqlalchemy_connection(dsn: str, body: Unit) -> Any:
    engine = create_async_engine(url(dsn, "asyncpg"))
    try:
        async with engine.begin() as conn:
            return await body(conn)
    finally:
        await engine.dispose()


async def via_psycopg(dsn: str, body: Unit) -> Any:
    async with await psycopg.AsyncConnection.connect(dsn) as conn, conn.transaction():
        return await body(conn)


def _sync(run: Callable[[str, Callable[[Any], Any]], Any]) -> Callable[[str, Unit], Awaitable[Any]]:
    """A synchronous stack run in a worker thread; `body` is given a sync handle."""

    async def transaction(dsn: str, body: Unit) -> Any:
        portal_body = body  # called back from the thread through anyio's portal

        def in_thread(tx: Any) -> Any:
            return anyio.from_thread.run(portal_body, SyncHandle(tx))

        return await anyio.to_thread.run_sync(run, dsn, in_thread)

    return transaction


@dataclass
class SyncHandle:
    """Wraps a synchronous connection for the async test body: the body awaits, the calls run
    synchronously in the test's worker thread."""

    tx: Any


def run_psycopg_sync(dsn: str, body: Callable[[Any], Any]) -> Any:
    with psycopg.connect(dsn) as conn, conn.transaction():
        return body(conn)


def run_sqlalchemy_sync(dsn: str, body: Callable[[Any], Any]) -> Any:
    engine = create_engine(url(dsn, "psycopg"))
    try:
        with Session(engine) as session, session.begin():
            return body(session)
    finally:
        engine.dispose()


STACKS = [
    Stack("asyncpg", via_asyncpg),
    Stack("sqlalchemy-async-session", via_sqlalchemy_session),
    Stack("sqlalchemy-async-connection", via_sqlalchemy_connection),
    Stack("psycopg-async", via_psycopg),
    Stack("psycopg-sync", _sync(run_psycopg_sync)),
    Stack("sqlalchemy-sync-session", _sync(run_sqlalchemy_sync)),
]


async def write(tx: Any, row_id: str) -> None:
    """The caller's own write, through its own stack."""
    if isinstance(tx, SyncHandle):
        inner = tx.tx
        await anyio.to_thread.run_sync(lambda: _write_sync(inner, row_id))
        return
    if isinstance(tx, AsyncSession) or type(tx).__module__.startswith("sqlalchemy"):
        await tx.execute(text("INSERT INTO domain_rows (id) VALUES (:id)"), {"id": row_id})
    elif isinstance(tx, psycopg.AsyncConnection):
        await tx.execute("INSERT INTO domain_rows (id) VALUES (%s)", (row_id,))
    else:
        await tx.execute("INSERT INTO domain_rows (id) VALUES ($1)", row_id)


def _write_sync(tx: Any, row_id: str) -> None:
    if isinstance(tx, psycopg.Connection):
        tx.execute("INSERT INTO domain_rows (id) VALUES (%s)", (row_id,))
    else:
        tx.execute(text("INSERT INTO domain_rows (id) VALUES (:id)"), {"id": row_id})


async def append(tx: Any, campaign_id: str, n: int = 1, **options: Any) -> outbox.AppendResult:
    events = [Event("deposited", {"amount": i}) for i in range(n)]
    if isinstance(tx, SyncHandle):
        inner = tx.tx
        return await anyio.to_thread.run_sync(
            lambda: outbox.sync.append(inner, campaign_id, events, **options)
        )
    return await outbox.append(tx, campaign_id, events, **options)


@asynccontextmanager
async def domain(pool: db.Pool) -> AsyncIterator[None]:
    await pool.execute(DOMAIN)
    yield


async def domain_ids(pool: db.Pool) -> list[str]:
    return [r["id"] for r in await pool.fetch("SELECT id FROM domain_rows ORDER BY id")]


@pytest.fixture(params=STACKS, ids=[s.name for s in STACKS])
def stack(request: pytest.FixtureRequest) -> Stack:
    chosen: Stack = request.param
    return chosen


async def test_a_commit_keeps_the_callers_row_and_the_events(
    pool: db.Pool, dsn: str, stack: Stack
) -> None:
    async with domain(pool):

        async def body(tx: Any) -> outbox.AppendResult:
            await write(tx, "order-1")
            return await append(tx, "c", 3)

        result = await stack.transaction(dsn, body)
    assert (result.first_seq, result.last_seq, result.duplicate) == (1, 3, False)
    assert await domain_ids(pool) == ["order-1"]
    assert await journal_seqs(pool, "c") == [1, 2, 3]
    assert (await counts(pool))["projection_apply_outbox"] == 3


@pytest.mark.parametrize("append_first", [False, True], ids=["write-first", "append-first"])
async def test_a_rollback_drops_the_callers_row_and_the_events(
    pool: db.Pool, dsn: str, stack: Stack, append_first: bool
) -> None:
    async with domain(pool):

        async def body(tx: Any) -> None:
            if append_first:  # the trap: the append is the transaction's first statement
                await append(tx, "c", 2)
                await write(tx, "order-1")
            else:
                await write(tx, "order-1")
                await append(tx, "c", 2)
            raise Rollback

        with pytest.raises(Rollback):
            await stack.transaction(dsn, body)
    assert await domain_ids(pool) == []
    assert set((await counts(pool)).values()) == {0}


async def test_a_keyed_retry_returns_the_first_result_and_a_refusal_keeps_the_transaction(
    pool: db.Pool, dsn: str, stack: Stack
) -> None:
    async with domain(pool):

        async def body(tx: Any) -> tuple[outbox.AppendResult, outbox.AppendResult]:
            first = await append(tx, "c", 2, idempotency_key="req-1")
            again = await append(tx, "c", 2, idempotency_key="req-1")
            with pytest.raises(outbox.ConcurrencyError) as refused:
                await append(tx, "c", 1, expected_seq=0)
            assert (refused.value.expected_seq, refused.value.actual_seq) == (0, 2)
            with pytest.raises(outbox.ValidationError) as invalid:
                await append(tx, "", 1)
            assert invalid.value.field == "campaign_id"
            await write(tx, "still-usable")
            return first, again

        first, again = await stack.transaction(dsn, body)
    assert (first.seqs, first.duplicate) == (range(1, 3), False)
    assert (again.seqs, again.duplicate) == (range(1, 3), True)
    assert await journal_seqs(pool, "c") == [1, 2]
    assert await domain_ids(pool) == ["still-usable"]


async def test_two_stacks_appending_to_one_campaign_keep_seqs_gap_free(
    pool: db.Pool, dsn: str
) -> None:
    results: list[outbox.AppendResult] = []

    async def appender(stack: Stack, n: int) -> None:
        for _ in range(n):
            results.append(await stack.transaction(dsn, lambda tx: append(tx, "shared", 2)))

    async with anyio.create_task_group() as tg:
        for stack in STACKS:
            tg.start_soon(appender, stack, 5)
    assert await journal_seqs(pool, "shared") == list(range(1, 2 * 5 * len(STACKS) + 1))
    assert sorted(s for r in results for s in r.seqs) == list(range(1, 2 * 5 * len(STACKS) + 1))


async def test_anything_else_is_a_type_error_naming_what_is_accepted(
    pool: db.Pool, dsn: str
) -> None:
    with pytest.raises(TypeError, match="asyncpg Pool or Connection, an SQLAlchemy"):
        await outbox.append(object(), "c", [Event("t", {})])
    with pytest.raises(TypeError, match="psycopg Connection, an SQLAlchemy Connection"):
        outbox.sync.append(pool, "c", [Event("t", {})])
    with psycopg.connect(dsn) as conn, pytest.raises(TypeError, match=r"use outbox\.sync\.append"):
        await outbox.append(conn, "c", [Event("t", {})])
    assert set((await counts(pool)).values()) == {0}


async def test_the_waits_and_the_worker_refuse_an_sqlalchemy_object_saying_what_to_pass(
    dsn: str,
) -> None:
    """`wait_applied`, `running_worker` and `drain_now` need asyncpg's LISTEN: given the
    application's SQLAlchemy session or engine, one line says to open a pool of their own."""
    app = outbox.Outbox(outbox.Settings(dsn=dsn))
    engine = create_async_engine(url(dsn, "asyncpg"))
    try:
        async with AsyncSession(engine) as session:
            with pytest.raises(TypeError, match=r"wait_applied takes an asyncpg Pool or Conn"):
                await outbox.wait_applied(session, "c", 1, timeout=1)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match=r"outbox\.create_pool\(dsn\)"):
            async with outbox.running_worker(app, engine):  # type: ignore[arg-type]
                pass
        with pytest.raises(TypeError, match=r"drain_now takes .*AsyncEngine"):
            await outbox.drain_now(app, engine)  # type: ignore[arg-type]
    finally:
        await engine.dispose()


@pytest.mark.parametrize("stack", STACKS, ids=[s.name for s in STACKS])
async def test_an_unmigrated_database_is_one_line_on_every_stack(
    fresh_db: str, stack: Stack
) -> None:
    with pytest.raises(outbox.SchemaNotReady, match="run `maintenance migrate`"):
        await stack.transaction(fresh_db, lambda tx: append(tx, "c", 1, settings=Settings()))
