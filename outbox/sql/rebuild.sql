-- Projection rebuild (S19): start a projector over for one campaign from the journal.

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
