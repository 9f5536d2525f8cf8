"""CLI conventions and packaging: --version, -h, python -m outbox, maintenance schema --sql."""

from __future__ import annotations

import re
import subprocess
import sys

import asyncpg
import pytest

import outbox
from helpers import ROOT, run_cli
from outbox import db
from outbox.schema import check_current, load_migrations


def module(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "outbox", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize("prog", ["outbox-worker", "maintenance"])
def test_both_tools_print_their_version_and_take_h(prog: str) -> None:
    version = run_cli(prog, "--version")
    assert version.returncode == 0, version.stderr
    assert version.stdout.strip() == f"outbox {outbox.__version__}"
    short = run_cli(prog, "-h")
    assert short.returncode == 0
    assert "--install-completion" in short.stdout  # shell completion is on
    assert short.stdout == run_cli(prog, "--help").stdout


def test_python_m_outbox_runs_both_tools() -> None:
    assert module("--version").stdout.strip() == f"outbox {outbox.__version__}"
    assert "Usage: python -m outbox worker" in module("worker", "-h").stdout
    assert "outbox-report" in module("maintenance", "-h").stdout
    bad = module("wrker")
    assert bad.returncode == 2
    assert bad.stderr.strip().splitlines() == [
        "python -m outbox: error: unknown tool 'wrker'; expected worker or maintenance (see -h)"
    ]


def test_the_package_ships_its_license_changelog_and_typing_marker() -> None:
    assert (ROOT / "LICENSE").read_text().startswith("MIT License")
    changelog = (ROOT / "CHANGELOG.md").read_text()
    release = re.sub(r"\.dev[0-9]+$", "", outbox.__version__)  # a development build's release
    assert f"\n## {release} - " in changelog
    # Each release after the first says how an upgrade to it runs: rolling, or with a stop.
    sections = re.split(r"^## ", changelog, flags=re.M)[1:]
    assert sections[-1].startswith("0.1.0 - ")
    for section in sections[:-1]:
        assert re.search(r"^### Upgrading .*: (rolling|needs a stop)$", section, re.M), section[:40]
    assert (ROOT / "outbox" / "py.typed").exists()


async def test_schema_sql_is_the_migrations_and_makes_a_database_current(fresh_db: str) -> None:
    printed = run_cli("maintenance", "schema", "--sql")
    assert printed.returncode == 0, printed.stderr
    script = printed.stdout
    shipped = load_migrations()
    # Every file verbatim, in order, each recorded with its checksum.
    at = [script.index(m.sql.rstrip()) for m in shipped]
    assert at == sorted(at)
    for m in shipped:
        assert f"VALUES ('{m.name}', '{m.checksum}');" in script
    # Applied by "another tool" (one script, no outbox code), the schema counts as current.
    conn = await asyncpg.connect(fresh_db)
    try:
        await conn.execute(script)
    finally:
        await conn.close()
    pool = await db.create_pool(fresh_db, min_size=1, max_size=2)
    try:
        await check_current(pool)
    finally:
        await pool.close()
    # `maintenance migrate` afterwards finds nothing to do.
    again = run_cli("maintenance", "migrate", "--dsn", fresh_db)
    assert again.returncode == 0, again.stderr
    assert again.stdout == ""
    assert "schema current (0 migration(s) applied now)" in again.stderr
    # An upgrade by another tool ends with the definitions alone: applied again, still current.
    definitions = run_cli("maintenance", "schema", "--sql", "--definitions")
    assert definitions.returncode == 0, definitions.stderr
    assert "outbox_schema_migrations (" not in definitions.stdout
    assert "CREATE OR REPLACE FUNCTION outbox_claim(" in definitions.stdout
    conn = await asyncpg.connect(fresh_db)
    try:
        await conn.execute(definitions.stdout)
        await check_current(conn)
    finally:
        await conn.close()
    assert run_cli("maintenance", "migrate", "--dsn", fresh_db).stdout == ""
