"""The console scripts, as subprocesses: help, usage errors, migrate."""

from __future__ import annotations

import subprocess

import asyncpg
import orjson
import pytest

from helpers import BIN
from outbox.schema import load_migrations


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / args[0]), *args[1:]],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=env,
    )


@pytest.mark.parametrize("script", ["maintenance", "outbox-worker"])
def test_help_works(script: str) -> None:
    proc = run(script, "--help")
    assert proc.returncode == 0, proc.stderr
    assert "Usage" in proc.stdout


@pytest.mark.parametrize(
    "args",
    [
        ("maintenance", "no-such-command"),
        ("maintenance", "migrate", "--no-such-flag"),
        ("maintenance", "migrate"),
        ("maintenance", "--log-level", "loud", "migrate"),
        ("maintenance", "migrate", "--dsn", "mysql://x"),
    ],
)
def test_usage_errors_exit_2_with_one_line(args: tuple[str, ...]) -> None:
    env = {"PATH": "/usr/bin:/bin"}
    proc = run(*args, env=env)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith(f"{args[0]}: error: ")
    assert "Traceback" not in proc.stderr


async def test_migrate_twice_then_status_json(fresh_db: str) -> None:
    first = run("maintenance", "migrate", "--dsn", fresh_db)
    assert first.returncode == 0, first.stderr
    assert "applied 0001_schema.sql" in first.stdout
    second = run("maintenance", "migrate", "--dsn", fresh_db, "--json")
    assert second.returncode == 0, second.stderr
    assert orjson.loads(second.stdout) == {"schema_version": 1, "mode": "migrate", "applied": []}
    listed = run("maintenance", "migrate", "--status", "--json", "--dsn", fresh_db)
    body = orjson.loads(listed.stdout)
    assert body["mode"] == "migrate-status"
    shipped = [m.name for m in load_migrations()]
    assert [(m["name"], m["state"]) for m in body["migrations"]] == [
        (name, "applied") for name in shipped
    ]
    assert isinstance(body["migrations"][0]["checksum"], str)
    assert isinstance(body["migrations"][0]["applied_at"], str)
    table = run("maintenance", "migrate", "--status", "--dsn", fresh_db)
    assert "0001_schema.sql" in table.stdout
    assert "applied" in table.stdout


async def test_migrate_refuses_an_edited_migration_with_one_line(fresh_db: str) -> None:
    assert run("maintenance", "migrate", "--dsn", fresh_db).returncode == 0
    conn = await asyncpg.connect(fresh_db)
    try:
        await conn.execute("UPDATE outbox.outbox_schema_migrations SET checksum = 'tampered'")
    finally:
        await conn.close()
    proc = run("maintenance", "migrate", "--dsn", fresh_db)
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1
    assert "0001_schema.sql was edited" in lines[0]
