"""The Citus tier (`make test-citus`): collected only with `--citus`, against the root
conftest's cluster (a coordinator and two workers on loopback). The kill soak reuses the fault
tier's harness (its workers are real processes; its oracle is the generator's own record)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

FAULTS = Path(__file__).resolve().parent.parent / "faults"
sys.path.insert(0, str(FAULTS))

from harness import SUMMARY, fleet, witness_table  # noqa: E402

__all__ = ["fleet", "witness_table"]  # the scenario fixtures, shared with tests/faults


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if SUMMARY:
        terminalreporter.section("citus tier")
        for line in SUMMARY:
            terminalreporter.write_line(line)
