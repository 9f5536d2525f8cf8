-- Projector versions (S29): the live version, the superseded ones, a version's distance from
-- caught up, and a promotion.

-- name: get_live_version
-- The version of projector $1 (its declared name) that readers read (outbox_live_version).
SELECT @extschema@.outbox_live_version($1::text)

-- name: list_superseded_versions
-- The recorded versions below their projector's live version: owed no work.
SELECT v.projector
FROM @extschema@.outbox_projector_versions v
WHERE v.state = 'superseded'
ORDER BY v.projector

-- name: list_versions
-- Every recorded version of projector $1 (its declared name; null: every projector's), lowest
-- first, with its state and, for the live one, when it was promoted and by whom.
SELECT v.projector, v.base, v.version, v.state, v.promoted_at, v.promoted_by
FROM @extschema@.outbox_projector_versions v
WHERE $1::text IS NULL OR v.base = $1::text
ORDER BY v.base, v.version

-- name: lock_versions
-- The versions' lock, exclusive, for a promotion (outbox_lock_versions), waiting at most $1
-- milliseconds (the transaction's lock_timeout from here).
SELECT @extschema@.outbox_lock_versions(true, $1::integer)

-- name: get_version_lag
-- How far version $1 (its key) stands from caught up: no row, not recorded; whether its sweep
-- is done, its holds (any status: catching up, failing, dead), and, for an ordered version
-- that starts at the beginning, the campaigns with work rows whose history before them it
-- lacks (its checkpoint below the first row's seq less one: the campaign's claim heals it, not
-- the sweep). The cost grows with the holds and the queue's campaigns, never the journal.
SELECT p.swept_at IS NOT NULL AS swept,
       (SELECT count(*) FROM @extschema@.projection_holds h WHERE h.projector = $1::text)
           AS holds,
       CASE WHEN p.ordered AND p.start = 'beginning' THEN (
           SELECT count(*)
           FROM (SELECT o.bucket, o.campaign_id, min(o.seq) AS first_seq
                 FROM @extschema@.projection_apply_outbox o
                 GROUP BY o.bucket, o.campaign_id) w
           LEFT JOIN @extschema@.projection_checkpoints k
               ON k.bucket = w.bucket AND k.campaign_id = w.campaign_id
              AND k.projector = $1::text
           WHERE coalesce(k.applied_seq, 0) < w.first_seq - 1)
       ELSE 0 END AS campaigns
FROM @extschema@.outbox_projectors p
WHERE p.projector = $1::text

-- name: promote_version
-- Make version $2 of projector $1 live (by $3, because $4), audited under the version's key
-- ($5); the version live before (null: none was recorded).
WITH before AS (
    SELECT l.version FROM @extschema@.outbox_projector_live l
    WHERE l.projector = $1::text
    FOR UPDATE
), live AS (
    INSERT INTO @extschema@.outbox_projector_live AS l (projector, version, promoted_by)
    VALUES ($1::text, $2::integer, $3::text)
    ON CONFLICT (projector) DO UPDATE
    SET version = excluded.version, promoted_at = excluded.promoted_at,
        promoted_by = excluded.promoted_by
), audited AS (
    INSERT INTO @extschema@.outbox_projector_audit (projector, action, actor, reason)
    VALUES ($5::text, 'promote', $3::text, $4::text)
)
SELECT (SELECT b.version FROM before b) AS previous
