-- Holds (S24) as operators' tools read them.

-- name: list_row_holds
-- The holds of row ($1, $2) in bucket $3, by projector.
SELECT h.projector, h.seq, h.status, h.attempt_count, h.next_attempt_at, h.last_error
FROM @extschema@.projection_holds h
WHERE h.bucket = $3::integer AND h.campaign_id = $1::text AND h.seq = $2::bigint
ORDER BY h.projector

-- name: count_holds
-- Holds per projector (S24), campaign $1 (in bucket $2) or all: failed, dead and waiting
-- (pending: paused, requeued, or catching up from the journal), the campaigns they hold, and
-- since when (and for how many seconds, by the database clock) the oldest has held.
SELECT h.projector,
       count(*) FILTER (WHERE h.status = 'failed') AS failed,
       count(*) FILTER (WHERE h.status = 'dead') AS dead,
       count(*) FILTER (WHERE h.status = 'pending') AS waiting,
       count(DISTINCT h.campaign_id) AS campaigns,
       min(h.created_at) AS since,
       extract(epoch FROM clock_timestamp() - min(h.created_at))::double precision
           AS held_seconds
FROM @extschema@.projection_holds h
WHERE $1::text IS NULL OR (h.bucket = $2::integer AND h.campaign_id = $1::text)
GROUP BY h.projector
ORDER BY h.projector

-- name: refresh_held_rows
-- Rows ($2, $3) of bucket $1 take their columns from their holds (outbox_hold_rows).
SELECT @extschema@.outbox_hold_rows($1::integer, $2::text[], $3::bigint[], statement_timestamp())

-- name: delete_projector_holds
-- Every hold of projector $1 (a retirement: it owes nothing now), whatever its bucket; returns
-- what each was on.
DELETE FROM @extschema@.projection_holds
WHERE projector = $1::text
RETURNING campaign_id, projector, seq

-- name: get_projector_owed
-- Whether projector $1 (subscribed to types $2) is owed work now: a hold of it not dead, or a
-- work row of its types, due or not (each an index probe or the first row found).
SELECT EXISTS (
           SELECT 1 FROM @extschema@.projection_holds h
           WHERE h.projector = $1::text AND h.status <> 'dead')
    OR EXISTS (
           SELECT 1 FROM @extschema@.projection_apply_outbox o
           WHERE o.event_type = ANY ($2::text[]))

-- name: get_projector_stall
-- Projector $1 (subscribed to types $2), by the database clock: the events it is dead on and
-- those it is failing on (its holds so, and the rows of its types so with no hold: a failure
-- no projector raised, S24, which it waits behind too); the seconds since the longest-waiting
-- of its due holds was last worked (null: none due); and since the oldest due work row of its
-- types that no hold stands for was enqueued (null: none). One pass over its holds, one over
-- the rows of its types.
WITH held AS (
    SELECT count(*) FILTER (WHERE h.status = 'dead') AS dead,
           count(*) FILTER (WHERE h.status = 'failed') AS failed,
           extract(epoch FROM clock_timestamp() - min(h.updated_at) FILTER (
               WHERE h.status <> 'dead' AND h.next_attempt_at <= clock_timestamp()
           ))::double precision AS seconds
    FROM @extschema@.projection_holds h
    WHERE h.projector = $1::text
), own AS (
    SELECT count(*) FILTER (WHERE o.status = 'dead') AS dead,
           count(*) FILTER (WHERE o.status = 'failed') AS failed,
           extract(epoch FROM clock_timestamp() - min(o.enqueued_at) FILTER (
               WHERE o.status IN ('pending', 'failed') AND o.next_attempt_at <= clock_timestamp()
           ))::double precision AS seconds
    FROM @extschema@.projection_apply_outbox o
    WHERE o.event_type = ANY ($2::text[])
      AND NOT EXISTS (
          SELECT 1 FROM @extschema@.projection_holds y
          WHERE y.bucket = o.bucket AND y.campaign_id = o.campaign_id AND y.seq = o.seq
      )
)
SELECT held.dead + own.dead AS dead, held.failed + own.failed AS failed,
       held.seconds AS hold_seconds, own.seconds AS row_seconds
FROM held, own
