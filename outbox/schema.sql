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

-- name: set_migration_buckets
-- The number of buckets migration 0009 fixes (`outbox.buckets`), for this transaction only.
SELECT set_config('outbox.buckets', $1::text, true)

-- name: get_schema_buckets
-- The number of buckets the schema was given (migration 0009 writes it into
-- outbox_bucket_count's body), or NULL before 0009.
SELECT substring(pg_get_function_sqlbody(to_regproc('outbox_bucket_count')) FROM '[0-9]+')::integer
