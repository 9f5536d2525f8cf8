"""The Citus tier (`make test-citus`): collected only with `--citus`, against the root
conftest's cluster (a coordinator and two workers on loopback). The kill soak reuses the fault
tier's harness (its workers are real processes; its oracle is the generator's own record)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

FAULTS = Path(__file__).resolve().parent.parent / "faults"
sys.path.insert(0, str(FAULTS))

from faults_app import SCHEMA  # noqa: E402
from harness import SUMMARY, Fleet  # noqa: E402

from outbox import db  # noqa: E402


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if SUMMARY:
        terminalreporter.section("citus tier")
        for line in SUMMARY:
            terminalreporter.write_line(line)


@pytest.fixture
async def witness_table(pool: db.Pool) -> None:
    await pool.execute(SCHEMA)


@pytest.fixture
def fleet(dsn: str, tmp_path: Path) -> Iterator[Fleet]:
    fleet = Fleet(dsn, tmp_path)
    yield fleet
    fleet.kill_all()
