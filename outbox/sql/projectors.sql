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
