-- Stalled campaigns: work the claim cannot take and nothing explains (S33).

-- name: list_stalled_campaigns
-- Campaigns whose head row (their first row not dead) is pending or failed, due for more than
-- $1 seconds by the database clock, with no hold standing for it, and which the claim cannot
-- take: no campaign row, or one that is neither blocked nor due (a head in backoff is not due
-- yet, a held one waits for its holds, a blocked campaign is listed as blocked). Oldest due
-- first, at most $2, each with how long its head has been due. Under ordering `none` the
-- claim reads the rows themselves: the caller does not ask.
WITH heads AS (
    SELECT DISTINCT ON (o.bucket, o.campaign_id)
           o.bucket, o.campaign_id, o.seq, o.status, o.next_attempt_at
    FROM @extschema@.projection_apply_outbox o
    WHERE o.status <> 'dead'
    ORDER BY o.bucket, o.campaign_id, o.seq
)
SELECT h.campaign_id, h.seq, h.status,
       extract(epoch FROM clock_timestamp() - h.next_attempt_at)::double precision
           AS due_seconds,
       c.due_at
FROM heads h
LEFT JOIN @extschema@.projection_apply_campaigns c
    ON c.bucket = h.bucket AND c.campaign_id = h.campaign_id
WHERE h.status IN ('pending', 'failed')
  AND h.next_attempt_at < clock_timestamp() - make_interval(secs => $1::double precision)
  AND NOT EXISTS (
      SELECT 1 FROM @extschema@.projection_holds y
      WHERE y.bucket = h.bucket AND y.campaign_id = h.campaign_id AND y.seq = h.seq)
  AND (c.campaign_id IS NULL OR (NOT c.blocked AND c.due_at > clock_timestamp()))
ORDER BY h.next_attempt_at, h.campaign_id
LIMIT $2::integer
