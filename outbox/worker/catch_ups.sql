-- The catch-ups a worker runs by the engine (`catch_ups.py`, S25, S30).

-- name: list_unswept
-- Which of projectors $1 still catch up from the beginning: recorded, their sweep not done,
-- not superseded (a superseded version is owed nothing, S29); and whether each is paused.
SELECT p.projector,
       EXISTS (SELECT 1 FROM @extschema@.outbox_projector_pauses z
               WHERE z.projector = p.projector) AS paused
FROM @extschema@.outbox_projectors p
JOIN @extschema@.outbox_projector_versions v ON v.projector = p.projector
WHERE p.projector = ANY ($1::text[]) AND p.swept_at IS NULL AND v.state <> 'superseded'
ORDER BY p.projector

-- name: complete_sweep
-- Projector $1 caught up by the engine (S25, S30): its sweep is done, as the report and a
-- version's promotion read it.
UPDATE @extschema@.outbox_projectors SET swept_at = clock_timestamp()
WHERE projector = $1::text AND swept_at IS NULL
