-- Schema migrations bookkeeping.

-- name: lock_migrations
-- Serialise migrators: a session-level advisory lock held while files are applied.
SELECT pg_advisory_lock($1::bigint)

-- name: unlock_migrations
-- Release the migrators' advisory lock.
SELECT pg_advisory_unlock($1::bigint)

-- name: create_migrations_table
-- The record of applied files; created by the runner itself before the first file.
CREATE TABLE IF NOT EXISTS outbox_schema_migrations (
    name       text        PRIMARY KEY,
    checksum   text        NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT clock_timestamp()
)

-- name: get_migrations_table
-- Whether the bookkeeping table exists (an unmigrated database has none).
SELECT to_regclass('outbox_schema_migrations') IS NOT NULL

-- name: list_applied_migrations
-- Applied files in name order.
SELECT name, checksum, applied_at FROM outbox_schema_migrations ORDER BY name

-- name: record_migration
-- Record one applied file, in the transaction that applied it.
INSERT INTO outbox_schema_migrations (name, checksum) VALUES ($1::text, $2::text)
