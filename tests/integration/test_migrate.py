"""Migrations and definitions: ordered, idempotent, checksummed, locked; the schema they
create; a changed definitions file applied again, never an older one over a newer."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import anyio
import asyncpg
import pytest

from helpers import ROOT, TABLES_0_1_0
from outbox import MigrationError, SchemaNotReady, db
from outbox.schema import (
    check_current,
    definition_status,
    load_definitions,
    load_migrations,
    migrate,
    status,
)

SQL_DIR = ROOT / "sql"

SCHEMA_SNAPSHOT = """
SELECT c.relname, c.relkind, c.reloptions::text, a.attname, a.atttypid::regtype::text
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
LEFT JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0
WHERE n.nspname = 'outbox' ORDER BY 1, 4
"""


def first_file(directory: Path) -> Path:
    return sorted(directory.glob("*.sql"))[0]


def append_line(path: Path, line: str) -> Path:
    path.write_text(path.read_text() + f"\n{line}\n")
    return path


@pytest.fixture
def sql_copy(tmp_path: Path) -> Path:
    target = tmp_path / "sql"
    shutil.copytree(SQL_DIR, target)
    return target


async def test_migrate_creates_every_table_and_second_run_changes_nothing(fresh_db: str) -> None:
    conn = await db.connect(fresh_db)
    try:
        with pytest.raises(SchemaNotReady, match="maintenance migrate"):
            await check_current(conn)
        applied = await migrate(conn)
        shipped = [m.name for m in load_migrations()] + [d.name for d in load_definitions()]
        assert applied == shipped
        tables = {  # 0.1.0's checkpoints table is a view of the same name since 0009
            r["table_name"]
            for r in await conn.fetch(
                "SELECT table_name FROM information_schema.tables WHERE table_schema = 'outbox'"
            )
        }
        assert tables >= set(TABLES_0_1_0)
        before = await conn.fetch(SCHEMA_SNAPSHOT)
        assert await migrate(conn) == []
        assert await conn.fetch(SCHEMA_SNAPSHOT) == before
        await check_current(conn)
        states = await status(conn)
        assert {s.state for s in states} == {"applied"}
    finally:
        await conn.close()


async def test_concurrent_migrators_apply_each_file_once(fresh_db: str) -> None:
    results: list[list[str]] = []

    async def run() -> None:
        conn = await db.connect(fresh_db)
        try:
            results.append(await migrate(conn))
        finally:
            await conn.close()

    async with anyio.create_task_group() as tg:
        for _ in range(4):
            tg.start_soon(run)
    shipped = len(load_migrations()) + len(load_definitions())
    assert sorted(len(r) for r in results) == [0, 0, 0, shipped]


async def test_edited_applied_file_is_refused(fresh_db: str, sql_copy: Path) -> None:
    conn = await db.connect(fresh_db)
    try:
        await migrate(conn, load_migrations(sql_copy))
        first = append_line(first_file(sql_copy), "-- an innocent edit")
        edited = load_migrations(sql_copy)
        with pytest.raises(MigrationError) as info:
            await migrate(conn, edited)
        assert first.name in str(info.value)
        assert "edited" in str(info.value)
        assert "\n" not in str(info.value)
        assert {s.state for s in await status(conn, edited)} >= {"edited"}
    finally:
        await conn.close()


async def test_pending_file_is_listed_then_applied(fresh_db: str, sql_copy: Path) -> None:
    conn = await db.connect(fresh_db)
    try:
        await migrate(conn, load_migrations(sql_copy))
        (sql_copy / "9000_extra.sql").write_text("CREATE TABLE extra_thing (x int);\n")
        with_extra = load_migrations(sql_copy)
        states = {s.name: s.state for s in await status(conn, with_extra)}
        assert states["9000_extra.sql"] == "pending"
        assert await migrate(conn, with_extra) == ["9000_extra.sql"]
        assert await conn.fetchval("SELECT to_regclass('outbox.extra_thing') IS NOT NULL")
    finally:
        await conn.close()


async def test_failed_migration_file_leaves_nothing_behind(fresh_db: str, sql_copy: Path) -> None:
    conn = await db.connect(fresh_db)
    try:
        await migrate(conn, load_migrations(sql_copy))
        (sql_copy / "9001_broken.sql").write_text("CREATE TABLE half (x int);\nSELECT 1/0;\n")
        with pytest.raises(asyncpg.DivisionByZeroError):
            await migrate(conn, load_migrations(sql_copy))
        assert not await conn.fetchval("SELECT to_regclass('outbox.half') IS NOT NULL")
        states = {s.name: s.state for s in await status(conn, load_migrations(sql_copy))}
        assert states["9001_broken.sql"] == "pending"
        # The advisory lock was released: another migrator is not blocked.
        assert await conn.fetchval("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'") == 0
    finally:
        await conn.close()


async def test_unknown_applied_migration_is_refused(fresh_db: str, sql_copy: Path) -> None:
    conn = await db.connect(fresh_db)
    try:
        (sql_copy / "9002_newer.sql").write_text("SELECT 1;\n")
        await migrate(conn, load_migrations(sql_copy))
        older = load_migrations(SQL_DIR)
        with pytest.raises(MigrationError, match=re.escape("9002_newer.sql")):
            await migrate(conn, older)
        assert "unknown" in {s.state for s in await status(conn, older)}
    finally:
        await conn.close()


def test_file_names_and_versions_are_checked(tmp_path: Path) -> None:
    (tmp_path / "0001_a.sql").write_text("SELECT 1;")
    (tmp_path / "0001_b.sql").write_text("SELECT 1;")
    (tmp_path / "README.md").write_text("ignored")
    with pytest.raises(MigrationError, match="version"):
        load_migrations(tmp_path)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(MigrationError, match="no migration files"):
        load_migrations(empty)
    with pytest.raises(MigrationError, match="not found"):
        load_migrations(tmp_path / "README.md")


async def test_outbox_table_shape(pool: db.Pool) -> None:
    slots = await pool.fetch(  # each slot of the work rows carries them (S26)
        "SELECT c.reloptions FROM pg_class c JOIN pg_inherits i ON i.inhrelid = c.oid "
        "WHERE i.inhparent = 'outbox.projection_apply_outbox'::regclass"
    )
    assert len(slots) == 3
    for (options,) in slots:
        assert "autovacuum_vacuum_scale_factor=0.01" in options
        assert "autovacuum_vacuum_threshold=1000" in options
        assert "autovacuum_vacuum_cost_delay=0" in options
    predicate = await pool.fetchval(
        "SELECT pg_get_expr(indpred, indrelid) FROM pg_index "
        "WHERE indexrelid = 'outbox.projection_apply_outbox_claim_idx'::regclass"
    )
    assert "pending" in predicate
    assert "failed" in predicate
    assert "dead" not in predicate
    await pool.execute(
        "INSERT INTO outbox.event_journal (bucket, campaign_id, seq, event_type, payload) "
        "VALUES (outbox.outbox_bucket('c'), 'c', 1, 't', '{}')"
    )
    with pytest.raises(asyncpg.CheckViolationError):
        await pool.execute(
            "INSERT INTO outbox.projection_apply_outbox (bucket, campaign_id, seq, "
            "event_type, status) "
            "VALUES (outbox.outbox_bucket('c'), 'c', 1, 't', 'done')"
        )


def _definitions_copy(tmp_path: Path) -> Path:
    """The shipped definitions files, copied where a test may edit them."""
    root = ROOT / "outbox"
    for d in load_definitions():
        target = tmp_path / "fn" / d.name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text((root / d.name).read_text())
    return tmp_path / "fn"


async def test_a_changed_definitions_file_is_applied_by_the_next_migrate(
    fresh_db: str, tmp_path: Path
) -> None:
    copy = _definitions_copy(tmp_path)
    conn = await db.connect(fresh_db)
    try:
        await migrate(conn, definitions=load_definitions(copy))
        now = "SELECT outbox.outbox_now(NULL) = statement_timestamp()"
        assert await conn.fetchval(now)
        clock = copy / "queue" / "settle_fn.sql"
        clock.write_text(
            clock.read_text().replace(
                "RETURN coalesce(p_at, statement_timestamp());",
                "RETURN coalesce(p_at, statement_timestamp()) + interval '1 hour';",
            )
        )
        changed = load_definitions(copy)
        states = {d.name: d.state for d in await definition_status(conn, changed)}
        assert states["queue/settle_fn.sql"] == "pending"
        assert {s for n, s in states.items() if n != "queue/settle_fn.sql"} == {"applied"}
        assert await migrate(conn, definitions=changed) == ["queue/settle_fn.sql"]
        assert not await conn.fetchval(now)
        assert await migrate(conn, definitions=changed) == []
    finally:
        await conn.close()


async def test_a_definition_a_newer_release_applied_is_never_put_back(
    fresh_db: str, tmp_path: Path
) -> None:
    """During a rolling deploy the newer release migrates first: the older release's workers
    find the schema current, and its migrate leaves the newer functions as they are."""
    copy = _definitions_copy(tmp_path)
    conn = await db.connect(fresh_db)
    try:
        await migrate(conn)
        await conn.execute(
            "UPDATE outbox.outbox_schema_definitions SET checksum = 'newer', version = '99.0.0' "
            "WHERE name = 'queue/claim_fn.sql'"
        )
        await check_current(conn)
        assert await migrate(conn, definitions=load_definitions(copy)) == []
        states = {d.name: d.state for d in await definition_status(conn)}
        assert states["queue/claim_fn.sql"] == "newer"
        # The same text applied by this release, or an older one: out of date until migrated.
        await conn.execute(
            "UPDATE outbox.outbox_schema_definitions SET version = '0.0.1' "
            "WHERE name = 'queue/claim_fn.sql'"
        )
        with pytest.raises(SchemaNotReady, match=r"queue/claim_fn\.sql.*maintenance migrate"):
            await check_current(conn)
        assert await migrate(conn) == ["queue/claim_fn.sql"]
        await check_current(conn)
    finally:
        await conn.close()
