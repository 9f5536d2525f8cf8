-- The work queue (projection_apply_outbox): claim, complete, fail.
-- Instants come from the database: coalesce($now, clock_timestamp()); `now` is a parameter only
-- so tests can move time forward without sleeping.

-- name: claim_campaign_heads
-- Ordering `campaign`: claim up to $1 due head rows (no earlier outstanding row in the campaign;
-- with $3 = true (park) dead rows do not count as outstanding), oldest first across campaigns,
-- skipping rows other workers hold. With each head, lock following rows of its campaign in seq
-- order (only the head's holder can reach them), the rest of the batch shared among the heads
-- so a claim never takes more than $1 rows: one hot campaign gets the whole budget. Events come
-- along (fused load), payload and metadata as text: the worker decodes each row on its own, so
-- an undecodable event fails its row, never the claim (S8).
WITH heads AS (
    SELECT o.campaign_id, o.seq
    FROM projection_apply_outbox o
    WHERE o.status IN ('pending', 'failed')
      AND o.next_attempt_at <= coalesce($2::timestamptz, clock_timestamp())
      AND NOT EXISTS (
          SELECT 1 FROM projection_apply_outbox e
          WHERE e.campaign_id = o.campaign_id AND e.seq < o.seq
            AND NOT ($3::boolean AND e.status = 'dead')
      )
    ORDER BY o.next_attempt_at, o.seq
    LIMIT $1::integer
    FOR UPDATE OF o SKIP LOCKED
), claimed AS (
    SELECT h.campaign_id, h.seq FROM heads h
    UNION ALL
    SELECT f.campaign_id, f.seq
    FROM heads h
    CROSS JOIN LATERAL (
        SELECT x.campaign_id, x.seq
        FROM projection_apply_outbox x
        WHERE x.campaign_id = h.campaign_id AND x.seq > h.seq
        ORDER BY x.seq
        LIMIT (SELECT ($1::integer - count(*)) / greatest(count(*), 1) FROM heads)
        FOR UPDATE OF x
    ) f
)
SELECT c.campaign_id, c.seq, o.status, o.attempt_count,
       o.status IN ('pending', 'failed')
           AND o.next_attempt_at <= coalesce($2::timestamptz, clock_timestamp()) AS due,
       j.event_type, j.payload::text AS payload, j.metadata::text AS metadata, j.recorded_at
FROM claimed c
JOIN projection_apply_outbox o ON o.campaign_id = c.campaign_id AND o.seq = c.seq
LEFT JOIN event_journal j ON j.campaign_id = c.campaign_id AND j.seq = c.seq
ORDER BY c.campaign_id, c.seq

-- name: claim_due_rows
-- Ordering `none`: claim up to $1 due rows, oldest first, skipping rows other workers hold.
WITH claimed AS (
    SELECT o.campaign_id, o.seq
    FROM projection_apply_outbox o
    WHERE o.status IN ('pending', 'failed')
      AND o.next_attempt_at <= coalesce($2::timestamptz, clock_timestamp())
    ORDER BY o.next_attempt_at, o.seq
    LIMIT $1::integer
    FOR UPDATE OF o SKIP LOCKED
)
SELECT c.campaign_id, c.seq, o.status, o.attempt_count, true AS due,
       j.event_type, j.payload::text AS payload, j.metadata::text AS metadata, j.recorded_at
FROM claimed c
JOIN projection_apply_outbox o ON o.campaign_id = c.campaign_id AND o.seq = c.seq
LEFT JOIN event_journal j ON j.campaign_id = c.campaign_id AND j.seq = c.seq
ORDER BY c.campaign_id, c.seq

-- name: delete_rows
-- Completed rows leave the queue.
DELETE FROM projection_apply_outbox o
USING unnest($1::text[], $2::bigint[]) AS d(campaign_id, seq)
WHERE o.campaign_id = d.campaign_id AND o.seq = d.seq

-- name: record_failures
-- Failure bookkeeping from arrays: attempts, status (failed or dead), the next attempt at
-- now + delay, and the error.
UPDATE projection_apply_outbox o
SET status = CASE WHEN f.dead THEN 'dead' ELSE 'failed' END,
    attempt_count = f.attempts,
    next_attempt_at = coalesce($6::timestamptz, clock_timestamp())
        + make_interval(secs => f.delay),
    last_error = f.error,
    updated_at = clock_timestamp()
FROM unnest($1::text[], $2::bigint[], $3::integer[], $4::double precision[], $5::text[],
            $7::boolean[]) AS f(campaign_id, seq, attempts, delay, error, dead)
WHERE o.campaign_id = f.campaign_id AND o.seq = f.seq

-- name: next_due_in
-- Seconds until the earliest claimable row is due, by the database clock (no row: nothing
-- waits). Heads only under ordering `campaign` ($2 false), so rows stuck behind a failed head
-- do not look due; $1 = park.
SELECT extract(epoch FROM o.next_attempt_at - clock_timestamp())::double precision
FROM projection_apply_outbox o
WHERE o.status IN ('pending', 'failed')
  AND ($2::boolean OR NOT EXISTS (
      SELECT 1 FROM projection_apply_outbox e
      WHERE e.campaign_id = o.campaign_id AND e.seq < o.seq
        AND NOT ($1::boolean AND e.status = 'dead')
  ))
ORDER BY o.next_attempt_at
LIMIT 1

-- name: outstanding_upto
-- Whether any work row of campaign $1 at or below seq $2 is still outstanding.
SELECT EXISTS (
    SELECT 1 FROM projection_apply_outbox WHERE campaign_id = $1::text AND seq <= $2::bigint
)

-- name: claim_one
-- Lock one queue row without waiting (a row a running batch holds raises 55P03) and load its
-- event; blocked_by is the earliest earlier outstanding row of its campaign (dead rows do not
-- count under park, $3).
SELECT o.campaign_id, o.seq, o.status, o.attempt_count, true AS due,
       j.event_type, j.payload::text AS payload, j.metadata::text AS metadata, j.recorded_at,
       (SELECT min(e.seq) FROM projection_apply_outbox e
        WHERE e.campaign_id = o.campaign_id AND e.seq < o.seq
          AND NOT ($3::boolean AND e.status = 'dead')) AS blocked_by
FROM projection_apply_outbox o
LEFT JOIN event_journal j ON j.campaign_id = o.campaign_id AND j.seq = o.seq
WHERE o.campaign_id = $1::text AND o.seq = $2::bigint
FOR UPDATE OF o NOWAIT

-- name: lock_campaign_rows
-- Hold every queued row of a campaign (waiting for a batch that has them), so no worker
-- applies the campaign while a rebuild runs.
SELECT count(*) FROM (
    SELECT 1 FROM projection_apply_outbox WHERE campaign_id = $1::text FOR UPDATE
) locked

-- name: notify_work
-- Wake the workers (after a requeue or a reconcile; appends notify in their own statement).
SELECT pg_notify($1::text, '')

-- name: record_observations
-- A shadow pass over claimed rows: count the sighting, stamp first and last seen, and look
-- again after $3 seconds (attempts, status and errors stay as they are).
UPDATE projection_apply_outbox o
SET seen_count = o.seen_count + 1,
    first_seen_at = coalesce(o.first_seen_at, coalesce($4::timestamptz, clock_timestamp())),
    last_seen_at = coalesce($4::timestamptz, clock_timestamp()),
    next_attempt_at = coalesce($4::timestamptz, clock_timestamp())
        + make_interval(secs => $3::double precision)
FROM unnest($1::text[], $2::bigint[]) AS s(campaign_id, seq)
WHERE o.campaign_id = s.campaign_id AND o.seq = s.seq
