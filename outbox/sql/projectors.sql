-- Projection guards: checkpoints of ordered projectors, markers of idempotent ones.

-- name: advance_checkpoint
-- Move an ordered projector's checkpoint from seq-1 to seq ($3) and say 'apply'; otherwise say
-- 'duplicate' (already at or past seq) or 'gap' (behind seq-1). Runs in the apply transaction,
-- so the move commits or rolls back with the projection's own writes.
WITH advanced AS (
    UPDATE projection_checkpoints
    SET applied_seq = $3::bigint, updated_at = clock_timestamp()
    WHERE campaign_id = $1::text AND projector = $2::text AND applied_seq = $3::bigint - 1
    RETURNING 'apply'::text AS verdict
), started AS (
    INSERT INTO projection_checkpoints (campaign_id, projector, applied_seq)
    SELECT $1::text, $2::text, $3::bigint WHERE $3::bigint = 1
    ON CONFLICT (campaign_id, projector) DO NOTHING
    RETURNING 'apply'::text AS verdict
)
SELECT coalesce(
    (SELECT verdict FROM advanced),
    (SELECT verdict FROM started),
    (SELECT CASE WHEN c.applied_seq >= $3::bigint THEN 'duplicate' ELSE 'gap' END
     FROM projection_checkpoints c WHERE c.campaign_id = $1::text AND c.projector = $2::text),
    'gap'
) AS verdict

-- name: get_checkpoint
-- An ordered projector's last applied seq in a campaign (no row: nothing applied).
SELECT applied_seq FROM projection_checkpoints WHERE campaign_id = $1::text AND projector = $2::text

-- name: reserve_marker
-- Reserve (handler, event) before an idempotent projector applies; no row back: a duplicate.
-- A concurrent reserver waits for the first to commit or roll back.
INSERT INTO processed_markers (campaign_id, seq, handler)
VALUES ($1::text, $2::bigint, $3::text)
ON CONFLICT (campaign_id, seq, handler) DO NOTHING
RETURNING true AS reserved
