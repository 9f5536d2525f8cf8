-- The bucket ring's read: which buckets have work, and from when.

-- name: list_due_buckets
-- Buckets with work and the seconds until it is due by the database clock or $2 (zero or less:
-- due now): campaign rows, or live work rows under ordering `none` ($1). With $3, only work not
-- due yet counts (a loop that took all it could waits for it by time). One index probe per
-- bucket (`outbox_due_buckets`, ring_fn.sql).
SELECT d.bucket,
       extract(epoch FROM d.due_at - coalesce($2::timestamptz, clock_timestamp()))::double precision
           AS due_in
FROM @extschema@.outbox_due_buckets(
    $1::boolean,
    CASE WHEN $3::boolean THEN coalesce($2::timestamptz, statement_timestamp())
         ELSE '-infinity'::timestamptz END
) d
ORDER BY d.bucket

-- name: get_spans
-- Whether a worker's batches claim across buckets: on one server they do; on Citus, where the
-- campaign queue is distributed by bucket, each batch claims in one bucket, on its shard.
SELECT NOT @extschema@.outbox_distributed('projection_apply_campaigns')

-- name: get_install_due_in
-- Seconds until the install's earliest unblocked campaign row is due by the database clock or
-- $1 (zero or less: due now; null: none), for a ring over every bucket (one server): one probe
-- of the due-order index per slot. With $2, only rows not due yet count (a loop that took all
-- it could waits for them by time).
SELECT extract(epoch FROM min(c.due_at) - coalesce($1::timestamptz, clock_timestamp()))::double precision
FROM @extschema@.projection_apply_campaigns c
WHERE NOT c.blocked
  AND c.due_at > CASE WHEN $2::boolean THEN coalesce($1::timestamptz, statement_timestamp())
                      ELSE '-infinity'::timestamptz END
