-- The append function's call (`call_fn.sql`), the same for every driver: values in `$n`
-- (the other paramstyles are derived from this text), casts written CAST(... AS ...) so the
-- text reads the same to asyncpg, psycopg, a DB-API cursor and SQLAlchemy's text().

-- name: append_events
-- One append: $1 campaign, $2 the events as one JSON array of {type, payload, metadata} (sent
-- as text), $3 expected_seq, $4 idempotency key, $5 enqueue, $6 the key's TTL in seconds. A
-- refusal comes back as a row (refusal, field, message), never as an error, so the caller's
-- transaction goes on after it.
SELECT first_seq, last_seq, duplicate, refusal, field, message
FROM @extschema@.outbox_try_append(
    CAST($1 AS text), CAST(CAST($2 AS text) AS jsonb), CAST($3 AS bigint), CAST($4 AS text),
    CAST($5 AS boolean), CAST($6 AS double precision)
)
