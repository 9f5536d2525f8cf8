-- Buckets: how many there are, and which ones have work.

-- name: get_bucket_count
-- How many buckets the campaign-keyed tables are split into (fixed at the first migrate).
SELECT @extschema@.outbox_bucket_count()

-- name: list_due_buckets
-- Buckets with work and the seconds until it is due by the database clock or $2 (zero or less:
-- due now): campaign rows, or live work rows under ordering `none` ($1). One index probe per
-- bucket (`outbox_due_buckets`).
SELECT d.bucket,
       extract(epoch FROM d.due_at - coalesce($2::timestamptz, clock_timestamp()))::double precision
           AS due_in
FROM @extschema@.outbox_due_buckets($1::boolean, '-infinity') d
ORDER BY d.bucket
