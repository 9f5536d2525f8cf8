-- Session set-up of worker connections.

-- name: apply_session_defaults
-- Set each parameter ($1) to its fallback value ($2) for this session, but only where nothing
-- else gave it a value (source 'default'): an operator's DSN options, ALTER ROLE/DATABASE ...
-- SET or postgresql.conf win over the library's defaults.
SELECT s.name, set_config(s.name, d.value, false) AS value
FROM unnest($1::text[], $2::text[]) AS d(name, value)
JOIN pg_settings s ON s.name = d.name
WHERE s.source = 'default'

-- name: apply_session_settings
-- A worker's session on a borrowed connection: each parameter ($1) set to its value ($2),
-- unconditionally where $3 is false (application_name, OUTBOX_* timeouts), only where nothing
-- else gave it a value (source 'default') where $3 is true (the timeouts' fallbacks).
SELECT s.name, set_config(s.name, d.value, false) AS value
FROM unnest($1::text[], $2::text[], $3::boolean[]) AS d(name, value, fallback)
JOIN pg_settings s ON s.name = d.name
WHERE NOT d.fallback OR s.source = 'default'

-- name: get_write_refusal
-- Why this session cannot write, or NULL when it can: the server is in recovery (a standby, or
-- one not promoted yet) or, unless $1 is false, the session is read-only by default (a role's
-- or database's default_transaction_read_only).
SELECT CASE
    WHEN pg_is_in_recovery() THEN 'the server is in recovery (a standby)'
    WHEN $1::boolean AND current_setting('transaction_read_only')::boolean
        THEN 'the session is read-only (default_transaction_read_only)'
END
