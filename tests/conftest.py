"""Test harness: a real PostgreSQL, a migrated template, a fresh database per test.

With OUTBOX_TEST_DSN set, tests create their databases on that server (the role needs
CREATEDB). Otherwise the session starts a throwaway cluster from the machine's binaries in a
temporary directory and destroys it at the end, on failure too. Each test gets a database
cloned from a template migrated once per session. No part of the database is mocked.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import asyncpg
import pytest

from helpers import with_database
from outbox import db
from outbox.config import Settings
from outbox.localpg import LocalCluster
from outbox.schema import migrate

UNIT = Path(__file__).resolve().parent / "unit"
DATABASE_FIXTURES = {"pg_server", "template_db", "fresh_db", "dsn", "pool", "settings"}


@pytest.fixture(autouse=True)
def _unit_tests_touch_no_database(request: pytest.FixtureRequest) -> None:
    """The unit tier runs with no PostgreSQL at all: a unit test asking for a database fails."""
    callspec = getattr(request.node, "callspec", None)
    parametrized = set(callspec.params) if callspec is not None else set()
    wanted = DATABASE_FIXTURES & (set(request.fixturenames) - parametrized)
    if wanted and UNIT in Path(str(request.node.path)).resolve().parents:
        pytest.fail(f"a unit test uses {sorted(wanted)}: it belongs in tests/integration")


@pytest.fixture(scope="session")
def pg_server() -> Iterator[str]:
    """An admin DSN on a server the tests may create databases on."""
    given = os.environ.get("OUTBOX_TEST_DSN", "").strip()
    if given:
        yield given
        return
    cluster = LocalCluster.temporary()
    try:
        yield cluster.start()
    finally:
        cluster.destroy()


async def _create_template(admin_dsn: str, name: str) -> None:
    admin = await asyncpg.connect(admin_dsn)
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
    finally:
        await admin.close()
    conn = await db.connect(with_database(admin_dsn, name))
    try:
        await migrate(conn)
    finally:
        await conn.close()


async def _drop_database(admin_dsn: str, name: str) -> None:
    admin = await asyncpg.connect(admin_dsn)
    try:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await admin.close()


@pytest.fixture(scope="session")
def template_db(pg_server: str) -> Iterator[str]:
    """A database migrated once per session, cloned by every test."""
    name = f"outbox_tpl_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    asyncio.run(_create_template(pg_server, name))
    try:
        yield name
    finally:
        asyncio.run(_drop_database(pg_server, name))


@pytest.fixture
async def fresh_db(pg_server: str) -> AsyncIterator[str]:
    """A DSN of an empty, unmigrated database, dropped after the test."""
    name = f"outbox_empty_{uuid.uuid4().hex[:12]}"
    admin = await asyncpg.connect(pg_server)
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
    finally:
        await admin.close()
    yield with_database(pg_server, name)
    await _drop_database(pg_server, name)


@pytest.fixture
async def dsn(pg_server: str, template_db: str) -> AsyncIterator[str]:
    """A DSN of a fresh migrated database, dropped after the test."""
    name = f"outbox_test_{uuid.uuid4().hex[:12]}"
    admin = await asyncpg.connect(pg_server)
    try:
        await admin.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template_db}"')
    finally:
        await admin.close()
    yield with_database(pg_server, name)
    await _drop_database(pg_server, name)


@pytest.fixture
async def pool(dsn: str) -> AsyncIterator[db.Pool]:
    p = await db.create_pool(dsn, min_size=1, max_size=30)
    try:
        yield p
    finally:
        await p.close()


@pytest.fixture
def settings(dsn: str) -> Settings:
    return Settings(dsn=dsn)
