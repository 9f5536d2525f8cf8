-- Read-your-writes: where a campaign's events up to a seq stand (`wait_applied`).

-- name: get_outstanding_upto
-- Whether any work row of campaign $1 (in bucket $3) at or below seq $2 is still outstanding.
SELECT EXISTS (
    SELECT 1 FROM @extschema@.projection_apply_outbox
    WHERE bucket = $3::integer AND campaign_id = $1::text AND seq <= $2::bigint
)

-- name: get_first_outstanding
-- The first work row of campaign $1 at or below seq $2 still outstanding (no row: all are
-- applied), with what holds it: status, attempts, last error, next attempt, and the seconds
-- until that attempt by the database clock. $3: the campaign's bucket.
SELECT seq, status, attempt_count, last_error, next_attempt_at,
       extract(epoch FROM next_attempt_at - clock_timestamp())::double precision AS due_in
FROM @extschema@.projection_apply_outbox
WHERE bucket = $3::integer AND campaign_id = $1::text AND seq <= $2::bigint
ORDER BY seq
LIMIT 1
