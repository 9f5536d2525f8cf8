"""Test harness: a real PostgreSQL, a migrated template, a fresh database per test.

With OUTBOX_TEST_DSN set, tests create their databases on that server (the role needs
CREATEDB). Otherwise the session starts a throwaway cluster from the machine's binaries in a
temporary directory and destroys it at the end, on failure too. Each test gets a database
cloned from a template migrated once per session. No part of the database is mocked. The
machinery is `outbox.testing`, the plugin applications use (these fixtures keep the suite's
own names, and let the fault tier swap the server).
"""

from __future__ import annotations

import shutil
import subprocess
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import anyio
import pytest

from helpers import ROOT
from outbox import db
from outbox.config import Settings

if TYPE_CHECKING:
    # Imported when the fixture runs: it imports outbox.testing, which the plugin line below
    # must load first (a plugin imported earlier is not rewritten for asserts).
    from outbox.testing.localcitus import CitusCluster

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


CITUS_TIER = Path(__file__).resolve().parent / "citus"


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """tests/citus runs only with `--citus` (make test-citus)."""
    if not config.getoption("citus") and collection_path == CITUS_TIER:
        return True
    return None


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--citus",
        action="store_true",
        help="run against a throwaway Citus cluster (make test-citus): a coordinator and two "
        "workers on loopback, every test's database migrated and distributed",
    )


@pytest.fixture(scope="session")
def citus(request: pytest.FixtureRequest) -> Iterator[CitusCluster | None]:
    """The Citus cluster the suite runs on (`--citus`), or None: one PostgreSQL server."""
    if not request.config.getoption("citus"):
        yield None
        return
    from outbox.testing.localcitus import CitusCluster

    cluster = CitusCluster.temporary()
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.destroy()


@pytest.fixture(scope="session")
def pg_server(citus: CitusCluster | None) -> Iterator[str]:
    """An admin DSN on a server the tests may create databases on (the fault tier overrides
    it with a server of its own, which it restarts); with `--citus`, the coordinator's."""
    if citus is not None:
        yield citus.coordinator.dsn
        return
    from outbox.testing import local_server

    with local_server() as dsn:
        yield dsn


@pytest.fixture(scope="session")
def outbox_server(pg_server: str) -> str:
    """The plugin's fixtures (`outbox_template`, `outbox_dsn`) on the suite's server."""
    return pg_server


@pytest.fixture(scope="session")
def template_db(request: pytest.FixtureRequest, citus: CitusCluster | None) -> str:
    """A database migrated once per session, cloned by every test (on Citus: distributed)."""
    if citus is not None:
        return anyio.run(citus.create_template)
    name: str = request.getfixturevalue("outbox_template")
    return name


@pytest.fixture
async def fresh_db(pg_server: str, citus: CitusCluster | None) -> AsyncIterator[str]:
    """A DSN of an empty, unmigrated database, dropped after the test."""
    from outbox.testing import clone_database, drop_database

    if citus is not None:
        dsn = await citus.create_database(f"outbox_empty_{uuid.uuid4().hex[:12]}")
        yield dsn
        await citus.drop(dsn)
        return
    dsn = await clone_database(pg_server, None, prefix="outbox_empty")
    yield dsn
    await drop_database(pg_server, urlsplit(dsn).path.lstrip("/"))


@pytest.fixture
async def dsn(pg_server: str, template_db: str, citus: CitusCluster | None) -> AsyncIterator[str]:
    """A DSN of a fresh migrated database, dropped after the test."""
    from outbox.testing import clone_database, drop_database

    if citus is not None:
        dsn = await citus.clone(template_db)
        yield dsn
        await citus.drop(dsn)
        return
    dsn = await clone_database(pg_server, template_db)
    yield dsn
    await drop_database(pg_server, urlsplit(dsn).path.lstrip("/"))


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


# The catch-up engine's tests (test_build, test_rebuild_engine).
@pytest.fixture
async def table(pool: db.Pool) -> None:
    """The `sums` table the `tally` projector adds into (helpers.SUMS)."""
    from helpers import SUMS

    await pool.execute(SUMS)


@pytest.fixture
def small_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    """Engine steps of few campaigns and fewer events: campaigns cut across steps."""
    from outbox.projection import build as engine

    monkeypatch.setattr(engine, "CAMPAIGNS", 4)
    monkeypatch.setattr(engine, "EVENTS", 9)


@pytest.fixture(scope="session")
def node_project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory with docs/examples/node's dependencies (`pg`) installed by `npm ci` from its
    lock file, for the tests that run Node programs (they write their scripts into it). Skips,
    saying why, where the machine has no node or npm (.ci/run installs Debian's)."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        pytest.skip("node and npm are not installed (.ci/run installs Debian's)")
    where = tmp_path_factory.mktemp("node")
    for name in ("package.json", "package-lock.json"):
        shutil.copy(ROOT / "docs" / "examples" / "node" / name, where / name)
    installed = subprocess.run(
        [npm, "ci", "--no-audit", "--no-fund", "--ignore-scripts"],
        cwd=where, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert installed.returncode == 0, installed.stderr
    return where
