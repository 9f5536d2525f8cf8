-- Enqueue-gap repair: journal events with no work row.

-- name: unqueued_events
-- Journal events with no work row, after the keyset cursor ($2, $3), one campaign ($1) or all,
-- in (campaign_id, seq) order, at most $4.
SELECT j.campaign_id, j.seq, j.event_type
FROM event_journal j
WHERE ($1::text IS NULL OR j.campaign_id = $1::text)
  AND (j.campaign_id, j.seq) > ($2::text, $3::bigint)
  AND NOT EXISTS (
      SELECT 1 FROM projection_apply_outbox o
      WHERE o.campaign_id = j.campaign_id AND o.seq = j.seq
  )
ORDER BY j.campaign_id, j.seq
LIMIT $4::integer

-- name: enqueue_rows
-- Work rows for the given events (an existing row wins: enqueueing twice is a no-op).
INSERT INTO projection_apply_outbox (campaign_id, seq, event_type)
SELECT * FROM unnest($1::text[], $2::bigint[], $3::text[])
ON CONFLICT (campaign_id, seq) DO NOTHING

-- name: unqueued_campaigns
-- Campaigns ($1, or all) with live work rows but no campaign row: rows inserted with triggers
-- off (session_replication_role = replica, a restore with --disable-triggers). Scans the work
-- rows: a repair, never a worker's statement.
SELECT DISTINCT o.campaign_id
FROM projection_apply_outbox o
WHERE o.status IN ('pending', 'failed')
  AND ($1::text IS NULL OR o.campaign_id = $1::text)
  AND NOT EXISTS (
      SELECT 1 FROM projection_apply_campaigns c WHERE c.campaign_id = o.campaign_id
  )
ORDER BY o.campaign_id
