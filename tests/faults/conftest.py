"""The fault tier (`make test-faults`): its own PostgreSQL, restartable, and a summary.

The tier always starts a throwaway cluster from the machine's binaries (it restarts the
server, so it never runs against a shared OUTBOX_TEST_DSN). Each scenario gets a fresh
migrated database with the witness table. Every test here carries the `faults` marker, which
the default `make test` run deselects; each scenario records one summary line, printed at
the end of the run.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import asyncpg
import pytest
from faults_app import SCHEMA
from harness import SUMMARY, Fleet

from helpers import with_database
from outbox import db
from outbox.localpg import LocalCluster, LocalClusterError, find_bindir
from outbox.migrate import migrate


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).resolve().parent
    for item in items:
        if here in Path(str(item.path)).resolve().parents:
            item.add_marker(pytest.mark.faults)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if SUMMARY:
        terminalreporter.section("fault tier")
        for line in SUMMARY:
            terminalreporter.write_line(line)
        total = sum(int(line.split("faults=")[1].split()[0]) for line in SUMMARY)
        terminalreporter.write_line(f"total faults injected: {total}")


@pytest.fixture(scope="session")
def cluster() -> Iterator[LocalCluster]:
    try:
        find_bindir()
    except LocalClusterError as exc:
        pytest.skip(f"the fault tier restarts its own PostgreSQL: {exc}")
    local = LocalCluster.temporary()
    try:
        local.start()
        yield local
    finally:
        local.destroy()


@pytest.fixture
async def scenario_dsn(cluster: LocalCluster) -> AsyncIterator[str]:
    name = f"faults_{uuid.uuid4().hex[:10]}"
    admin = await asyncpg.connect(cluster.dsn)
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
    finally:
        await admin.close()
    target = with_database(cluster.dsn, name)
    conn = await db.connect(target)
    try:
        await migrate(conn)
        await conn.execute(SCHEMA)
    finally:
        await conn.close()
    yield target
    admin = await asyncpg.connect(cluster.dsn)
    try:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await admin.close()


@pytest.fixture
async def scenario_pool(scenario_dsn: str) -> AsyncIterator[db.Pool]:
    pool = await db.create_pool(scenario_dsn, min_size=1, max_size=20)
    try:
        yield pool
    finally:
        await pool.close()


@pytest.fixture
def fleet(scenario_dsn: str, tmp_path: Path) -> Fleet:
    return Fleet(scenario_dsn, tmp_path)
