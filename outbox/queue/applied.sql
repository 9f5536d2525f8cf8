-- Read-your-writes: where a campaign's events up to a seq stand (`wait_applied`).

-- name: get_outstanding_upto
-- Whether any work row of campaign $1 (in bucket $3) at or below seq $2 is still outstanding,
-- or a projector's hold (S24) at or below it: what a held projector owes has no row.
SELECT EXISTS (
    SELECT 1 FROM @extschema@.projection_apply_outbox
    WHERE bucket = $3::integer AND campaign_id = $1::text AND seq <= $2::bigint
) OR EXISTS (
    SELECT 1 FROM @extschema@.projection_holds
    WHERE bucket = $3::integer AND campaign_id = $1::text AND seq <= $2::bigint
)

-- name: get_first_outstanding
-- The first work row of campaign $1 at or below seq $2 still outstanding, else the first
-- projector's hold at or below it (S24; neither: all are applied), with what holds it: status,
-- attempts, last error, next attempt, and the seconds until that attempt by the database
-- clock. $3: the campaign's bucket.
SELECT x.seq, x.status, x.attempt_count, x.last_error, x.next_attempt_at,
       extract(epoch FROM x.next_attempt_at - clock_timestamp())::double precision AS due_in
FROM (
    (
        SELECT 0 AS rank, seq, status, attempt_count, last_error, next_attempt_at
        FROM @extschema@.projection_apply_outbox
        WHERE bucket = $3::integer AND campaign_id = $1::text AND seq <= $2::bigint
        ORDER BY seq
        LIMIT 1
    )
    UNION ALL
    (
        SELECT 1 AS rank, seq, status, attempt_count, last_error, next_attempt_at
        FROM @extschema@.projection_holds
        WHERE bucket = $3::integer AND campaign_id = $1::text AND seq <= $2::bigint
        ORDER BY seq
        LIMIT 1
    )
) x
ORDER BY x.rank
LIMIT 1
