"""Migrations: ordered, idempotent, checksummed, locked; the schema they create."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import anyio
import asyncpg
import pytest

import outbox
from helpers import ROOT
from outbox import Event, MigrationError, SchemaNotReady, db
from outbox.schema import check_current, load_migrations, migrate, status

SQL_DIR = ROOT / "sql"
TABLES = {
    "event_journal",
    "campaign_heads",
    "projection_apply_outbox",
    "projection_checkpoints",
    "processed_markers",
    "append_idempotency_keys",
    "consumer_claims",
    "outbox_workers",
    "outbox_requeue_audit",
}

SCHEMA_SNAPSHOT = """
SELECT c.relname, c.relkind, c.reloptions::text, a.attname, a.atttypid::regtype::text
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
LEFT JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0
WHERE n.nspname = 'public' ORDER BY 1, 4
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
        assert applied == [m.name for m in load_migrations()]
        tables = {r["tablename"] for r in await conn.fetch("SELECT tablename FROM pg_tables")}
        assert tables >= TABLES
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
    assert sorted(len(r) for r in results) == [0, 0, 0, len(load_migrations())]


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
        assert await conn.fetchval("SELECT to_regclass('extra_thing') IS NOT NULL")
    finally:
        await conn.close()


async def test_failed_migration_file_leaves_nothing_behind(fresh_db: str, sql_copy: Path) -> None:
    conn = await db.connect(fresh_db)
    try:
        await migrate(conn, load_migrations(sql_copy))
        (sql_copy / "9001_broken.sql").write_text("CREATE TABLE half (x int);\nSELECT 1/0;\n")
        with pytest.raises(asyncpg.DivisionByZeroError):
            await migrate(conn, load_migrations(sql_copy))
        assert not await conn.fetchval("SELECT to_regclass('half') IS NOT NULL")
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
    options = await pool.fetchval(
        "SELECT reloptions FROM pg_class WHERE relname = 'projection_apply_outbox'"
    )
    assert "autovacuum_vacuum_scale_factor=0.01" in options
    assert "autovacuum_vacuum_threshold=1000" in options
    assert "autovacuum_vacuum_cost_delay=0" in options
    predicate = await pool.fetchval(
        "SELECT pg_get_expr(indpred, indrelid) FROM pg_index "
        "WHERE indexrelid = 'projection_apply_outbox_claim_idx'::regclass"
    )
    assert "pending" in predicate
    assert "failed" in predicate
    assert "dead" not in predicate
    await pool.execute(
        "INSERT INTO event_journal (bucket, campaign_id, seq, event_type, payload) "
        "VALUES (outbox_bucket('c'), 'c', 1, 't', '{}')"
    )
    with pytest.raises(asyncpg.CheckViolationError):
        await pool.execute(
            "INSERT INTO projection_apply_outbox (bucket, campaign_id, seq, event_type, status) "
            "VALUES (outbox_bucket('c'), 'c', 1, 't', 'done')"
        )
    with pytest.raises(asyncpg.ForeignKeyViolationError):
        await pool.execute(
            "INSERT INTO projection_apply_outbox (bucket, campaign_id, seq, event_type) "
            "VALUES (outbox_bucket('c'), 'c', 2, 't')"
        )


async def test_keys_from_before_the_append_function_still_match_their_retry(
    fresh_db: str,
) -> None:
    """0006 moves the events' fingerprint into the database; keys the Python client wrote
    under 0004..0005 (its own sha256 of the events) are recomputed from the journal, so a
    retry of such an append after the upgrade is still a duplicate, not a conflict."""
    shipped = load_migrations()
    before = [m for m in shipped if m.name < "0006"]
    conn = await db.connect(fresh_db)
    try:
        await migrate(conn, before)
        # What the old client left behind: one keyed append of one event, its fingerprint
        # computed by a different encoding than the database's.
        await conn.execute(
            "INSERT INTO campaign_heads (campaign_id, last_seq) VALUES ('acct', 1);"
            "INSERT INTO event_journal (campaign_id, seq, event_type, payload, metadata) VALUES "
            "('acct', 1, 'deposited', '{\"amount\": 5}', '{\"idempotency_key\": \"req-1\"}');"
            "INSERT INTO append_idempotency_keys "
            "(campaign_id, idem_key, first_seq, last_seq, expires_at, fingerprint) VALUES "
            "('acct', 'req-1', 1, 1, clock_timestamp() + interval '1 hour', "
            "sha256('the old client''s encoding'))"
        )
        assert (await migrate(conn, shipped))[0] == "0006_append_function.sql"
        again = await outbox.append(
            conn, "acct", [Event("deposited", {"amount": 5})], idempotency_key="req-1"
        )
        assert (again.first_seq, again.last_seq, again.duplicate) == (1, 1, True)
        with pytest.raises(outbox.IdempotencyKeyConflict):
            await outbox.append(
                conn, "acct", [Event("deposited", {"amount": 6})], idempotency_key="req-1"
            )
    finally:
        await conn.close()
