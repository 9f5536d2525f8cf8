-- The projectors the database knows (outbox_projectors): recorded by the workers that run
-- them, retired by an operator (audited in outbox_projector_audit).

-- name: record_projectors
-- A worker's projectors as it runs them ($1: a JSON array of {projector, events, ordered,
-- transactional, start, definition, fingerprint}; by worker $2; the declared name and version
-- are read off the projector's key by the table): new ones first seen now, known ones
-- refreshed when their recorded definition is this worker's (S33; a record from before
-- definitions when its types, guard and transactional agree, and the definition is filled in;
-- the worker group that serves it, S35, is part of the definition outside the default group).
-- A known one whose definition differs is left as it was and does not come back: the caller
-- refuses the worker and rolls back. A new one that starts at the beginning has its sweep under
-- way (S25); where a projector starts counts once, when it is first seen. A projector none of
-- whose versions had a live one gets its lowest version here live (S29). Which were new comes
-- back.
WITH recorded AS (
    INSERT INTO @extschema@.outbox_projectors AS p
        (projector, events, ordered, transactional, start, first_seen_at, last_seen_at,
         last_seen_by, swept_at, definition, fingerprint, group_name)
    SELECT r.projector, r.events, r.ordered, r.transactional, r.start, c.at, c.at, $2::text,
           CASE WHEN r.start = 'now' THEN c.at END, r.definition, r.fingerprint,
           coalesce(r.definition ->> 'group', 'default')
    FROM jsonb_to_recordset($1::text::jsonb)
        AS r(projector text, events text[], ordered boolean, transactional boolean, start text,
             definition jsonb, fingerprint text),
        (SELECT clock_timestamp() AS at) c
    ORDER BY r.projector
    ON CONFLICT (projector) DO UPDATE
    SET definition = excluded.definition, fingerprint = excluded.fingerprint,
        last_seen_at = excluded.last_seen_at, last_seen_by = excluded.last_seen_by
    WHERE p.definition = excluded.definition
       OR (p.definition IS NULL AND p.events = excluded.events AND p.ordered = excluded.ordered
           AND p.transactional = excluded.transactional AND excluded.group_name = 'default')
    RETURNING p.projector, p.base, p.version, p.first_seen_at = p.last_seen_at AS new
), live AS (
    INSERT INTO @extschema@.outbox_projector_live (projector, version, promoted_by)
    SELECT r.base, min(r.version), 'first recorded by ' || $2::text
    FROM recorded r
    GROUP BY r.base
    ORDER BY r.base
    ON CONFLICT (projector) DO NOTHING
)
SELECT projector, new FROM recorded

-- name: list_projectors
-- Every recorded projector, by name, with whether it is paused, its version's state (S29) and
-- its definition and fingerprint (S33; NULL: recorded before definitions).
SELECT p.projector, p.events, p.ordered, p.transactional, p.start, p.first_seen_at,
       p.last_seen_at, p.last_seen_by, s.projector IS NOT NULL AS paused, p.base, p.version,
       v.state, p.definition, p.fingerprint, p.group_name
FROM @extschema@.outbox_projectors p
JOIN @extschema@.outbox_projector_versions v ON v.projector = p.projector
LEFT JOIN @extschema@.outbox_projector_pauses s ON s.projector = p.projector
ORDER BY p.projector

-- name: retire_projector
-- Retire projector $1 (by $2, because $3), audited; the record as it was (no row: not
-- recorded, and nothing is audited). A pause of it goes too.
WITH retired AS (
    DELETE FROM @extschema@.outbox_projectors
    WHERE projector = $1::text
    RETURNING projector, events, ordered, transactional, start, first_seen_at, last_seen_at,
              last_seen_by, base, version, definition, fingerprint, group_name
), unpaused AS (
    DELETE FROM @extschema@.outbox_projector_pauses
    WHERE projector IN (SELECT projector FROM retired)
), audited AS (
    INSERT INTO @extschema@.outbox_projector_audit (projector, action, actor, reason)
    SELECT r.projector, 'retire', $2::text, $3::text FROM retired r
)
SELECT r.projector, r.events, r.ordered, r.transactional, r.start, r.first_seen_at,
       r.last_seen_at, r.last_seen_by, false AS paused, r.base, r.version, v.state,
       r.definition, r.fingerprint, r.group_name
FROM retired r
JOIN @extschema@.outbox_projector_versions v ON v.projector = r.projector  -- as it was

-- name: redefine_projector
-- An operator records projector $1's definition as $2 (fingerprint $3), by $4, because $5
-- (S33: a change safe in place, which leaves its types, guard and transactional as they
-- are; checked by the caller against the record it locked with lock_projector): audited with the change ($6) in the reason. The record as it is now.
WITH redefined AS (
    UPDATE @extschema@.outbox_projectors
    SET definition = $2::jsonb, fingerprint = $3::text
    WHERE projector = $1::text
    RETURNING projector
), audited AS (
    INSERT INTO @extschema@.outbox_projector_audit (projector, action, actor, reason)
    SELECT r.projector, 'redefine', $4::text, $5::text || ' (' || $6::text || ')'
    FROM redefined r
)
SELECT count(*) FROM redefined

-- name: lock_projector
-- Projector $1's record, locked for an operator's change (no row: not recorded).
SELECT p.projector, p.events, p.ordered, p.transactional, p.definition, p.fingerprint, p.version,
       p.group_name
FROM @extschema@.outbox_projectors p
WHERE p.projector = $1::text
FOR UPDATE

-- name: delete_checkpoints
-- Projector $1's checkpoints, every bucket's, keys and moves (a retirement that drops its
-- guards; on Citus one statement across the shards, like prune_markers).
WITH moves AS (
    DELETE FROM @extschema@.projection_checkpoint_moves WHERE projector = $1::text
)
DELETE FROM @extschema@.projection_checkpoint_keys WHERE projector = $1::text

-- name: delete_markers
-- Projector $1's processed markers (the same).
DELETE FROM @extschema@.processed_markers WHERE handler = $1::text
