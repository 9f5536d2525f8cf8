-- The schema's bookkeeping: which migrations and definitions an install has, the migrators'
-- lock, and the install's schema itself.

-- name: lock_migrations
-- Serialise migrators: a session-level advisory lock held while files are applied.
SELECT pg_advisory_lock($1::bigint)

-- name: unlock_migrations
-- Release the migrators' advisory lock.
SELECT pg_advisory_unlock($1::bigint)

-- name: get_schema_exists
-- Whether the install's schema exists (CREATE SCHEMA needs a privilege an existing one does
-- not: the migrator only creates what is missing).
SELECT to_regnamespace('@extschema@') IS NOT NULL

-- name: create_schema
-- The install's schema, at its first migrate.
CREATE SCHEMA @extschema@

-- name: create_migrations_table
-- The record of applied migration files; created by the runner itself before the first file.
CREATE TABLE IF NOT EXISTS @extschema@.outbox_schema_migrations (
    name       text        PRIMARY KEY,
    checksum   text        NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT clock_timestamp()
)

-- name: create_definitions_table
-- The record of applied definitions files: the text's sha256 and the release that applied it
-- (an older release's migrate never puts its older functions back).
CREATE TABLE IF NOT EXISTS @extschema@.outbox_schema_definitions (
    name       text        PRIMARY KEY,
    checksum   text        NOT NULL,
    version    text        NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT clock_timestamp()
)

-- name: get_migrations_table
-- Whether the install's bookkeeping exists (an unmigrated database has none).
SELECT to_regclass('@extschema@.outbox_schema_migrations') IS NOT NULL

-- name: list_installs
-- The schemas of this database that hold an outbox install (its bookkeeping table).
SELECT n.nspname AS schema
FROM pg_class c
JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE c.relname = 'outbox_schema_migrations' AND c.relkind IN ('r', 'p')
ORDER BY n.nspname

-- name: list_applied_migrations
-- Applied migration files in name order.
SELECT name, checksum, applied_at FROM @extschema@.outbox_schema_migrations ORDER BY name

-- name: get_definitions_table
-- Whether the record of definitions exists (an install migrated before definitions has none).
SELECT to_regclass('@extschema@.outbox_schema_definitions') IS NOT NULL

-- name: list_applied_definitions
-- Applied definitions files in name order.
SELECT name, checksum, version, applied_at FROM @extschema@.outbox_schema_definitions
ORDER BY name

-- name: record_migration
-- Record one applied migration file, in the transaction that applied it.
INSERT INTO @extschema@.outbox_schema_migrations (name, checksum) VALUES ($1::text, $2::text)

-- name: record_definition
-- Record one applied definitions file ($1, sha256 $2, by release $3), in the transaction that
-- applied it.
INSERT INTO @extschema@.outbox_schema_definitions (name, checksum, version)
VALUES ($1::text, $2::text, $3::text)
ON CONFLICT (name) DO UPDATE
SET checksum = excluded.checksum, version = excluded.version, applied_at = clock_timestamp()

-- name: set_install_path
-- For the rest of this transaction, unqualified names are the install's (the files name the
-- outbox's objects so) and a function pins this path (SET search_path FROM CURRENT).
SET LOCAL search_path = @extschema@, pg_temp

-- name: set_migration_buckets
-- The number of buckets the bucket functions are given at the first migrate (`outbox.buckets`),
-- for this transaction only.
SELECT set_config('outbox.buckets', $1::text, true)

-- name: get_schema_buckets
-- The number of buckets the schema was given (written into outbox_bucket_count's body when it
-- was first migrated), or NULL before.
SELECT substring(pg_get_function_sqlbody(to_regproc('@extschema@.outbox_bucket_count'))
                 FROM '[0-9]+')::integer
