-- Paused projectors: operators' holds on a projector, their audit, and the
-- workers' read.

-- name: list_paused_projectors
-- Every pause in force, by projector name.
SELECT projector, paused_at, paused_by, reason
FROM @extschema@.outbox_projector_pauses
ORDER BY projector

-- name: pause_projector
-- Pause projector $1 (by $2, because $3), audited. A projector already paused keeps its first
-- pause: no row comes back then, and nothing is audited.
WITH paused AS (
    INSERT INTO @extschema@.outbox_projector_pauses (projector, paused_by, reason)
    VALUES ($1::text, $2::text, $3::text)
    ON CONFLICT (projector) DO NOTHING
    RETURNING projector, paused_at, paused_by, reason
), audited AS (
    INSERT INTO @extschema@.outbox_projector_audit (projector, action, actor, reason)
    SELECT p.projector, 'pause', p.paused_by, p.reason FROM paused p
)
SELECT projector, paused_at, paused_by, reason FROM paused

-- name: resume_projector
-- Lift the pause of projector $1 (by $2, because $3), audited; the pause as it was (no row:
-- it was not paused, and nothing is audited).
WITH resumed AS (
    DELETE FROM @extschema@.outbox_projector_pauses
    WHERE projector = $1::text
    RETURNING projector, paused_at, paused_by, reason
), audited AS (
    INSERT INTO @extschema@.outbox_projector_audit (projector, action, actor, reason)
    SELECT r.projector, 'resume', $2::text, $3::text FROM resumed r
)
SELECT projector, paused_at, paused_by, reason FROM resumed

-- name: list_projector_audit
-- Pauses and resumes, newest first, at most $1.
SELECT at, projector, action, actor, reason
FROM @extschema@.outbox_projector_audit
ORDER BY audit_id DESC
LIMIT $1::integer
