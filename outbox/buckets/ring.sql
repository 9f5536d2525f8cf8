-- The bucket ring's read: which buckets have work, and from when.

-- name: list_due_buckets
-- Buckets with work and the seconds until it is due by the database clock or $2 (zero or less:
-- due now): campaign rows, or live work rows under ordering `none` ($1). One index probe per
-- bucket (`outbox_due_buckets`, ring_fn.sql).
SELECT d.bucket,
       extract(epoch FROM d.due_at - coalesce($2::timestamptz, clock_timestamp()))::double precision
           AS due_in
FROM @extschema@.outbox_due_buckets($1::boolean, '-infinity') d
ORDER BY d.bucket
