-- Paused projectors (migration 0008): operators' holds on a projector, and the workers' read.

-- name: list_paused_projectors
-- Every pause in force, by projector name.
SELECT projector, paused_at, paused_by, reason
FROM outbox_projector_pauses
ORDER BY projector

-- name: pause_projector
-- Pause projector $1 (by $2, because $3). A projector already paused keeps its first pause:
-- no row comes back then.
INSERT INTO outbox_projector_pauses (projector, paused_by, reason)
VALUES ($1::text, $2::text, $3::text)
ON CONFLICT (projector) DO NOTHING
RETURNING projector, paused_at, paused_by, reason

-- name: resume_projector
-- Lift the pause of projector $1; the pause as it was (no row: it was not paused).
DELETE FROM outbox_projector_pauses
WHERE projector = $1::text
RETURNING projector, paused_at, paused_by, reason
