"""The fault tier (`make test-faults`): its own restartable PostgreSQL, and a summary.

The tier always starts a throwaway cluster from the machine's binaries and hands it to the
root conftest as `pg_server` (it restarts the server, so it never runs against a shared
OUTBOX_TEST_DSN); each scenario gets the root's fresh migrated database (`dsn`, `pool`) plus
the witness table. Every test here carries the `faults` marker, which the default `make test`
run deselects; each scenario records one summary line, printed at the end of the run.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from harness import SUMMARY, fleet, witness_table

from outbox.errors import LocalClusterError
from outbox.testing.localpg import LocalCluster, find_bindir

__all__ = ["fleet", "witness_table"]  # the scenario fixtures (harness), shared with tests/citus


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


@pytest.fixture(scope="session")
def pg_server(cluster: LocalCluster) -> str:
    return cluster.dsn


@pytest.fixture(autouse=True)
def _every_scenario_has_the_witness(witness_table: None) -> None:
    """Every scenario here writes the witness tables (`harness.witness_table`)."""
