-- A batch of SQL projectors in one call (`sql_batch.py`; the function is in sql_batch_fn.sql).

-- name: apply_sql_batch
-- One batch in bucket $1 ($2 campaigns, $3 rows at most) by plan $4 (JSON): whether the
-- function took it (else nothing of it was written, and why), what it claimed and applied,
-- each projector's events, the campaigns left due now and the seconds each row waited.
SELECT handled, reason, campaigns, claimed, applied, skipped, depth_rows, per_projector::text,
       due, ages
FROM @extschema@.outbox_apply_sql_batch(
    CAST($1 AS integer), CAST($2 AS integer), CAST($3 AS integer), CAST(CAST($4 AS text) AS jsonb))

-- name: apply_sql_holds
-- A worker group's batch (S35): up to $1 due holds per projector, at most $2 journal events
-- each, by plan $3 (JSON, with the group); the same columns.
SELECT handled, reason, campaigns, claimed, applied, skipped, depth_rows, per_projector::text,
       due, ages
FROM @extschema@.outbox_apply_sql_holds(
    CAST($1 AS integer), CAST($2 AS integer), CAST(CAST($3 AS text) AS jsonb))
