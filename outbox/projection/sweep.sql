-- The catch-up sweeps (S25) as the workers step them and the report reads them.

-- name: sweep_projector
-- One step of projector $1's sweep: at most $2 campaigns, none while it has $3 catch-up holds
-- or more (outbox_sweep); the holds placed, the campaigns looked at, whether it is done.
SELECT seeded, reached, swept FROM @extschema@.outbox_sweep($1::text, $2::integer, $3::integer)

-- name: list_sweeps
-- The recorded projectors that start at the beginning: their types, when first seen, and when
-- their sweep reached the last campaign (null: under way).
SELECT p.projector, p.events, p.first_seen_at, p.swept_at
FROM @extschema@.outbox_projectors p
WHERE p.start = 'beginning'
ORDER BY p.projector

-- name: count_catch_up_holds
-- Catch-up holds (seq 0) not yet dead, per projector.
SELECT h.projector, count(*) AS holds
FROM @extschema@.projection_holds h
WHERE h.seq = 0 AND h.status <> 'dead'
GROUP BY h.projector
