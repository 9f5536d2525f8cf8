-- The end of a batch and the campaign queue's upkeep: settle (deletes, failures, campaign rows,
-- checkpoint moves in one statement), refresh, unblock, wake-ups, shadow sightings.
-- Instants come from the database: coalesce($now, clock_timestamp()).

-- name: settle_batch
-- The end of a batch in one statement. Delete completed rows ($1, $2). Record failures from
-- arrays ($3..$8): attempts, status (failed or dead), the next attempt at now + delay, the
-- error. Write each campaign's row ($10..$14): delete it when the batch left it nothing live
-- (gone: its append head is held, and no row at or past head_seq, the first seq the batch did
-- not see, exists now), else set its head, blocked flag and due time (the failure's next
-- attempt when the head is a row this batch failed, else the given instant, else now). Move
-- the checkpoints of ordered projectors ($15..$17, sorted: a fixed lock order): the one
-- statement that writes a checkpoint's value (rebuilds reset and set theirs through it too).
-- With $18 and rows deleted, one payload-free NOTIFY on $19 (the applied channel: readers
-- waiting for their writes look again). Returns how many campaigns are left due now with a head
-- to take (head 0: waiting for an append in flight), so the worker claims again instead of
-- sleeping, and the seconds each deleted row waited since it was enqueued (for the
-- append-to-apply metric). $9 = now.
WITH done AS (
    DELETE FROM projection_apply_outbox o
    USING unnest($1::text[], $2::bigint[]) AS d(campaign_id, seq)
    WHERE o.campaign_id = d.campaign_id AND o.seq = d.seq
    RETURNING extract(epoch FROM clock_timestamp() - o.enqueued_at)::double precision AS age
), failed AS (
    UPDATE projection_apply_outbox o
    SET status = CASE WHEN f.dead THEN 'dead' ELSE 'failed' END,
        attempt_count = f.attempts,
        next_attempt_at = coalesce($9::timestamptz, clock_timestamp())
            + make_interval(secs => f.delay),
        last_error = f.error,
        updated_at = clock_timestamp()
    FROM unnest($3::text[], $4::bigint[], $5::integer[], $6::double precision[], $7::text[],
                $8::boolean[]) AS f(campaign_id, seq, attempts, delay, error, dead)
    WHERE o.campaign_id = f.campaign_id AND o.seq = f.seq
    RETURNING o.campaign_id, o.seq, o.next_attempt_at
), moved AS (
    INSERT INTO projection_checkpoints AS k (campaign_id, projector, applied_seq)
    SELECT m.campaign_id, m.projector, m.applied_seq
    FROM unnest($15::text[], $16::text[], $17::bigint[]) AS m(campaign_id, projector, applied_seq)
    ON CONFLICT (campaign_id, projector)
    DO UPDATE SET applied_seq = excluded.applied_seq, updated_at = clock_timestamp()
), target AS (
    SELECT t.campaign_id, t.head_seq, t.due_at, t.blocked, t.gone
    FROM unnest($10::text[], $11::bigint[], $12::timestamptz[], $13::boolean[], $14::boolean[])
        AS t(campaign_id, head_seq, due_at, blocked, gone)
), beyond AS (
    -- Campaigns the batch saw to their end that have rows past what it saw after all: an
    -- append committed before the heads were held (this statement's snapshot shows it).
    SELECT t.campaign_id FROM target t
    WHERE t.gone AND EXISTS (
        SELECT 1 FROM projection_apply_outbox o
        WHERE o.campaign_id = t.campaign_id AND o.seq >= t.head_seq
    )
), gone AS (
    DELETE FROM projection_apply_campaigns c
    USING target t
    WHERE t.gone AND c.campaign_id = t.campaign_id
      AND t.campaign_id NOT IN (SELECT campaign_id FROM beyond)
), kept AS (
    -- The batch holds these rows (its claim locked them): an update, no insert.
    UPDATE projection_apply_campaigns c
    SET head_seq = t.head_seq,
        due_at = coalesce(f.next_attempt_at, t.due_at, $9::timestamptz, clock_timestamp()),
        blocked = t.blocked,
        updated_at = clock_timestamp()
    FROM target t
    LEFT JOIN failed f ON f.campaign_id = t.campaign_id AND f.seq = t.head_seq
    WHERE c.campaign_id = t.campaign_id
      AND (NOT t.gone OR t.campaign_id IN (SELECT campaign_id FROM beyond))
    RETURNING c.head_seq, c.due_at, c.blocked
)
SELECT (
    SELECT count(*) FROM kept
    WHERE head_seq > 0 AND NOT blocked AND due_at <= coalesce($9::timestamptz, clock_timestamp())
) AS due,
(SELECT array_agg(age) FROM done) AS ages,
(SELECT count(pg_notify($19::text, '')) FROM (SELECT 1 FROM done LIMIT 1) d WHERE $18::boolean)
    AS notified

-- name: refresh_campaigns
-- Campaign rows ($1) brought in line with their work rows, for paths that change rows without
-- a claim (requeue, reconcile, replay, inline apply) and for campaigns a claim found behind
-- the truth: the head is the first live row (pending, failed, or processing under a lease:
-- due when the lease expires), blocked when any row precedes it (never under park, $2). With nothing live, the row is deleted when its append head is held ($3, see
-- lock_heads), else kept due now with head 0. Waits for a batch that holds one of them.
WITH state AS (
    SELECT t.campaign_id, h.seq, h.next_attempt_at,
           NOT $2::boolean AND EXISTS (
               SELECT 1 FROM projection_apply_outbox d
               WHERE d.campaign_id = t.campaign_id AND d.seq < h.seq
           ) AS blocked
    FROM unnest($1::text[]) AS t(campaign_id)
    LEFT JOIN LATERAL (
        SELECT o.seq, o.next_attempt_at
        FROM projection_apply_outbox o
        WHERE o.campaign_id = t.campaign_id AND o.status IN ('pending', 'failed', 'processing')
        ORDER BY o.seq
        LIMIT 1
    ) h ON true
), removed AS (
    DELETE FROM projection_apply_campaigns c
    USING state s
    WHERE c.campaign_id = s.campaign_id AND s.seq IS NULL AND s.campaign_id = ANY ($3::text[])
)
INSERT INTO projection_apply_campaigns AS c (campaign_id, head_seq, due_at, blocked)
SELECT s.campaign_id, coalesce(s.seq, 0), coalesce(s.next_attempt_at, clock_timestamp()),
       coalesce(s.blocked, false)
FROM state s
WHERE s.seq IS NOT NULL OR NOT s.campaign_id = ANY ($3::text[])
ORDER BY s.campaign_id
ON CONFLICT (campaign_id) DO UPDATE
SET head_seq = excluded.head_seq, due_at = excluded.due_at, blocked = excluded.blocked,
    updated_at = clock_timestamp()

-- name: unblock_campaigns
-- dead_policy=park: dead rows step aside, so no campaign is blocked (a fleet that ran with
-- block before leaves some marked).
UPDATE projection_apply_campaigns SET blocked = false, updated_at = clock_timestamp()
WHERE blocked

-- name: notify_work
-- A payload-free NOTIFY on channel $1: the workers' (after a requeue or a reconcile; appends
-- notify in their own statement), or the applied one (after a lease completes).
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
