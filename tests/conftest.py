"""Test harness: a real PostgreSQL, a migrated template, a fresh database per test.

With OUTBOX_TEST_DSN set, tests create their databases on that server (the role needs
CREATEDB). Otherwise the session starts a throwaway cluster from the machine's binaries in a
temporary directory and destroys it at the end, on failure too. Each test gets a database
cloned from a template migrated once per session. No part of the database is mocked. The
machinery is `outbox.testing`, the plugin applications use (these fixtures keep the suite's
own names, and let the fault tier swap the server).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from outbox import db
from outbox.config import Settings

# The plugin applications use: the suite's template and per-test database are its fixtures,
# under the suite's names (below), on the suite's server. The fixtures here import it only when
# they run: a plugin imported before pytest loads it is not rewritten for asserts.
pytest_plugins = ["outbox.testing"]

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
    """An admin DSN on a server the tests may create databases on (the fault tier overrides
    it with a server of its own, which it restarts)."""
    from outbox.testing import local_server

    with local_server() as dsn:
        yield dsn


@pytest.fixture(scope="session")
def outbox_server(pg_server: str) -> str:
    """The plugin's fixtures (`outbox_template`, `outbox_dsn`) on the suite's server."""
    return pg_server


@pytest.fixture(scope="session")
def template_db(outbox_template: str) -> str:
    """A database migrated once per session, cloned by every test."""
    return outbox_template


@pytest.fixture
async def fresh_db(pg_server: str) -> AsyncIterator[str]:
    """A DSN of an empty, unmigrated database, dropped after the test."""
    from outbox.testing import clone_database, drop_database

    dsn = await clone_database(pg_server, None, prefix="outbox_empty")
    yield dsn
    await drop_database(pg_server, urlsplit(dsn).path.lstrip("/"))


@pytest.fixture
def dsn(outbox_dsn: str) -> str:
    """A DSN of a fresh migrated database, dropped after the test."""
    return outbox_dsn


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
