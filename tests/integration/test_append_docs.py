"""Every example of docs/append.md runs as written, each on its own stack, against a real
server: your row and its event commit together. The Django example runs in the Django site's
subprocess (test_django.py); the Go example's statement runs here as pgx would send it (no Go
toolchain is needed to check the SQL it relies on)."""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Callable
from typing import Any

import anyio
import psycopg
import pytest
from sqlalchemy import create_engine
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session

import outbox
from helpers import ROOT, journal_seqs
from outbox import db

EXAMPLE = re.compile(r"^```(\w+) example=([\w-]+)\n(.*?)^```$", re.M | re.S)
EXAMPLES = {name: code for _, name, code in EXAMPLE.findall((ROOT / "docs/append.md").read_text())}


def url(dsn: str, driver: str) -> str:
    return dsn.replace("postgresql://", f"postgresql+{driver}://", 1)


def load(name: str) -> Callable[..., Any]:
    """The example's `place_order`, from the docs' own text."""
    namespace: dict[str, Any] = {}
    exec(compile(EXAMPLES[name], f"docs/append.md:{name}", "exec"), namespace)  # noqa: S102
    place: Callable[..., Any] = namespace["place_order"]
    return place


async def placed(pool: db.Pool, order_id: str) -> bool:
    row = await pool.fetchval("SELECT count(*) FROM orders WHERE id = $1", order_id)
    return bool(row == 1) and await journal_seqs(pool, f"order-{order_id}") == [1]


@pytest.fixture
async def orders(pool: db.Pool) -> None:
    await pool.execute("CREATE TABLE orders (id text PRIMARY KEY)")


def test_the_docs_have_an_example_per_stack() -> None:
    assert set(EXAMPLES) == {
        "asyncpg",
        "sqlalchemy-async",
        "sqlalchemy-sync",
        "psycopg",
        "django",
        "psql",
        "go",
    }


@pytest.mark.usefixtures("orders")
async def test_the_python_examples_run_as_written(pool: db.Pool, dsn: str) -> None:
    """Each twice: the second call, a retry of the same request, answers duplicate and writes
    nothing new."""
    results: dict[str, list[outbox.AppendResult]] = {}
    for _ in range(2):
        results.setdefault("o-asyncpg", []).append(await load("asyncpg")(pool, "o-asyncpg"))

        engine = create_async_engine(url(dsn, "asyncpg"))
        try:
            async with AsyncSession(engine) as session:
                results.setdefault("o-sa-async", []).append(
                    await load("sqlalchemy-async")(session, "o-sa-async")
                )
        finally:
            await engine.dispose()

        def sqlalchemy_sync() -> outbox.AppendResult:
            engine = create_engine(url(dsn, "psycopg"))
            try:
                with Session(engine) as session:
                    placed: outbox.AppendResult = load("sqlalchemy-sync")(session, "o-sa-sync")
                    return placed
            finally:
                engine.dispose()

        def psycopg_sync() -> outbox.AppendResult:
            with psycopg.connect(dsn) as conn:
                placed: outbox.AppendResult = load("psycopg")(conn, "o-psycopg")
                return placed

        results.setdefault("o-sa-sync", []).append(await anyio.to_thread.run_sync(sqlalchemy_sync))
        results.setdefault("o-psycopg", []).append(await anyio.to_thread.run_sync(psycopg_sync))
    for order_id, (first, retry) in results.items():
        assert isinstance(first, outbox.AppendResult)
        assert (first.duplicate, retry.duplicate) == (False, True), order_id
        assert (retry.first_seq, retry.last_seq) == (first.first_seq, first.last_seq)
        assert await placed(pool, order_id), order_id  # one order, one event


@pytest.mark.usefixtures("orders")
async def test_the_psql_example_runs_as_written(pool: db.Pool, dsn: str) -> None:
    psql = shutil.which("psql")
    if psql is None:
        pytest.skip("psql is not installed")
    for _ in range(2):  # the second: a retry of the same request, which writes nothing new
        proc = subprocess.run(  # noqa: ASYNC221 - a short, bounded client run
            [psql, dsn, "-v", "ON_ERROR_STOP=1", "-q", "-f", "-"],
            input=EXAMPLES["psql"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert proc.returncode == 0, proc.stderr
        assert await placed(pool, "o-psql")


@pytest.mark.usefixtures("orders")
async def test_the_go_examples_statement_runs_as_pgx_sends_it(pool: db.Pool, dsn: str) -> None:
    code = EXAMPLES["go"]
    call, insert = re.findall(r"`([^`]+)`", code)
    conn = await db.connect(dsn, codecs=False)  # jsonb as text, as pgx sends a Go string
    events = '[{"type":"order.placed","payload":{"id":"o-go"}}]'
    rows = []
    try:
        for _ in range(2):  # the second: a retry of the same request
            async with conn.transaction():
                row = await conn.fetchrow(call, "order-o-go", events, None, "place-o-go")
                assert row is not None
                if not row["duplicate"]:  # as the example does
                    await conn.execute(insert, "o-go")
                rows.append(row)
        with pytest.raises(Exception, match="expected seq 5, head is 1") as refused:
            async with conn.transaction():
                await conn.fetchrow(call, "order-o-go", events, 5, None)
    finally:
        await conn.close()
    first, again = rows
    assert (first["first_seq"], first["last_seq"], first["duplicate"]) == (1, 1, False)
    assert (again["first_seq"], again["duplicate"]) == (1, True)
    assert getattr(refused.value, "sqlstate", None) == "OB002"
    assert await placed(pool, "o-go")
