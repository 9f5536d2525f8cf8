-- Projection guards: checkpoints of ordered projectors, markers of idempotent ones.

-- name: advance_checkpoints
-- Move the checkpoints of every ordered projector ($3, sorted) from seq-1 to seq ($2) in one
-- statement: each event of a campaign passes every ordered projector's checkpoint, subscribed
-- or not, so a projector of a subset of types never mistakes the others for a gap. Verdict per
-- projector: 'apply', 'duplicate' (already at or past seq) or 'gap' (behind seq-1); with the
-- checkpoint as it stood before. Runs in the apply transaction.
WITH advanced AS (
    UPDATE projection_checkpoints c
    SET applied_seq = $2::bigint, updated_at = clock_timestamp()
    WHERE c.campaign_id = $1::text AND c.projector = ANY ($3::text[])
      AND c.applied_seq = $2::bigint - 1
    RETURNING c.projector
), started AS (
    INSERT INTO projection_checkpoints (campaign_id, projector, applied_seq)
    SELECT $1::text, p.projector, $2::bigint FROM unnest($3::text[]) AS p(projector)
    WHERE $2::bigint = 1
    ON CONFLICT (campaign_id, projector) DO NOTHING
    RETURNING projector
)
SELECT p.projector,
       CASE WHEN p.projector IN (SELECT projector FROM advanced)
              OR p.projector IN (SELECT projector FROM started) THEN 'apply'
            WHEN c.applied_seq >= $2::bigint THEN 'duplicate'
            ELSE 'gap' END AS verdict,
       coalesce(c.applied_seq, 0) AS applied_seq
FROM unnest($3::text[]) AS p(projector)
LEFT JOIN projection_checkpoints c ON c.campaign_id = $1::text AND c.projector = p.projector

-- name: reserve_marker
-- Reserve (handler, event) before an idempotent projector applies; no row back: a duplicate.
-- A concurrent reserver waits for the first to commit or roll back.
INSERT INTO processed_markers (campaign_id, seq, handler)
VALUES ($1::text, $2::bigint, $3::text)
ON CONFLICT (campaign_id, seq, handler) DO NOTHING
RETURNING true AS reserved

-- name: list_campaigns
-- Campaigns with events, one ($1) or all, in id order.
SELECT campaign_id FROM campaign_heads
WHERE $1::text IS NULL OR campaign_id = $1::text
ORDER BY campaign_id

-- name: reset_checkpoint
-- A rebuild starts a projector's campaign over: checkpoint 0, row locked until it commits.
INSERT INTO projection_checkpoints (campaign_id, projector, applied_seq)
VALUES ($1::text, $2::text, 0)
ON CONFLICT (campaign_id, projector) DO UPDATE SET applied_seq = 0, updated_at = clock_timestamp()

-- name: set_checkpoint
-- A rebuild ends at the journal head it read.
UPDATE projection_checkpoints SET applied_seq = $3::bigint, updated_at = clock_timestamp()
WHERE campaign_id = $1::text AND projector = $2::text

-- name: delete_markers
-- A rebuild of an idempotent projector forgets what it applied in the campaign.
DELETE FROM processed_markers WHERE campaign_id = $1::text AND handler = $2::text

-- name: journal_for_rebuild
-- The campaign's journal head and its events of the types ($2) a projector subscribes to,
-- up to that head, in seq order; both read in one snapshot, so the checkpoint set to the
-- head never passes an event the rebuild did not see. One row with null seq: no such events.
WITH head AS (
    SELECT coalesce(max(seq), 0) AS last_seq FROM event_journal WHERE campaign_id = $1::text
)
SELECT h.last_seq, e.seq, e.event_type, e.payload::text AS payload,
       e.metadata::text AS metadata, e.recorded_at
FROM head h
LEFT JOIN event_journal e
    ON e.campaign_id = $1::text AND e.event_type = ANY ($2::text[]) AND e.seq <= h.last_seq
ORDER BY e.seq

-- name: checkpoints_of
-- Checkpoints of the given campaigns.
SELECT campaign_id, projector, applied_seq FROM projection_checkpoints
WHERE campaign_id = ANY ($1::text[])

-- name: markers_of
-- Processed markers of the given events.
SELECT m.campaign_id, m.seq, m.handler
FROM processed_markers m
JOIN unnest($1::text[], $2::bigint[]) AS e(campaign_id, seq)
  ON m.campaign_id = e.campaign_id AND m.seq = e.seq
