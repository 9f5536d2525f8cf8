-- The work queue (projection_apply_outbox) and its campaign queue (projection_apply_campaigns):
-- claim, load, settle, refresh.
-- Instants come from the database: coalesce($now, clock_timestamp()); `now` is a parameter only
-- so tests can move time forward without sleeping. The claims compare with
-- statement_timestamp() instead: it is stable, so it bounds the index scan (a volatile
-- clock_timestamp() would only filter, and a claim would read every not-yet-due entry).

-- name: claim_campaigns
-- Ordering `campaign`: lock up to $1 due campaigns that are not blocked, oldest due first,
-- skipping campaigns other workers hold. A worker that holds a campaign owns its work rows
-- until it commits. The index holds no blocked campaign and the scan stops at the first
-- campaign not due, so the claim never visits work it cannot take. Nothing else is read here:
-- a campaign locked after its previous holder committed comes back as that holder left it,
-- while this statement's snapshot may predate that commit; `load_campaigns`, the next
-- statement, sees it.
SELECT c.campaign_id, c.head_seq
FROM projection_apply_campaigns c
WHERE NOT c.blocked AND c.due_at <= coalesce($2::timestamptz, statement_timestamp())
ORDER BY c.due_at
LIMIT $1::integer
FOR UPDATE SKIP LOCKED

-- name: load_campaigns
-- The claimed campaigns ($1, heads $2): each one's rows from its head in seq order, at most $3
-- each (the batch budget shared among them: one hot campaign gets all of it), with its first
-- and last outstanding seq (two index probes), the checkpoints of the ordered projectors ($5),
-- locked in a fixed order until the batch commits (a missing one means 0), and each row's
-- event, payload and metadata as text: the worker decodes each row on its own, so an
-- undecodable event fails its row, never the claim (S8). A campaign with no rows left comes
-- back as one row with a null seq. A `processing` row (lease mode, 0005) is due once its lease
-- expired: its next_attempt_at is its lease expiry. $4 = now.
WITH picked AS (
    SELECT p.campaign_id, p.head_seq
    FROM unnest($1::text[], $2::bigint[]) AS p(campaign_id, head_seq)
), checkpoints AS (
    SELECT k.campaign_id, k.projector, k.applied_seq
    FROM projection_checkpoints k
    WHERE k.campaign_id = ANY ($1::text[]) AND k.projector = ANY ($5::text[])
    ORDER BY k.campaign_id, k.projector
    FOR UPDATE
)
SELECT p.campaign_id, o.seq, o.status, o.attempt_count, o.next_attempt_at,
       o.status IN ('pending', 'failed', 'processing')
           AND o.next_attempt_at <= coalesce($4::timestamptz, statement_timestamp()) AS due,
       o.lease_owner, o.claim_epoch,
       b.first_seq, b.last_seq, k.projectors, k.applied_seqs,
       j.event_type, j.payload::text AS payload, j.metadata::text AS metadata, j.recorded_at
FROM picked p
CROSS JOIN LATERAL (
    SELECT min(x.seq) AS first_seq, max(x.seq) AS last_seq
    FROM projection_apply_outbox x
    WHERE x.campaign_id = p.campaign_id
) b
CROSS JOIN LATERAL (
    SELECT array_agg(c.projector) AS projectors, array_agg(c.applied_seq) AS applied_seqs
    FROM checkpoints c
    WHERE c.campaign_id = p.campaign_id
) k
LEFT JOIN LATERAL (
    SELECT x.seq, x.status, x.attempt_count, x.next_attempt_at, x.lease_owner, x.claim_epoch
    FROM projection_apply_outbox x
    WHERE x.campaign_id = p.campaign_id AND x.seq >= p.head_seq
    ORDER BY x.seq
    LIMIT $3::integer
) o ON true
LEFT JOIN event_journal j ON j.campaign_id = p.campaign_id AND j.seq = o.seq
ORDER BY p.campaign_id, o.seq

-- name: claim_due_rows
-- Ordering `none`: claim up to $1 due rows, oldest first, skipping rows other workers hold.
WITH claimed AS (
    SELECT o.campaign_id, o.seq
    FROM projection_apply_outbox o
    WHERE o.status IN ('pending', 'failed')
      AND o.next_attempt_at <= coalesce($2::timestamptz, statement_timestamp())
    ORDER BY o.next_attempt_at, o.seq
    LIMIT $1::integer
    FOR UPDATE OF o SKIP LOCKED
)
SELECT c.campaign_id, c.seq, o.status, o.attempt_count, o.next_attempt_at, true AS due,
       o.lease_owner, o.claim_epoch, NULL::bigint AS first_seq, NULL::bigint AS last_seq,
       NULL::text[] AS projectors, NULL::bigint[] AS applied_seqs,
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

-- name: lock_heads
-- Hold the append heads of campaigns ($1) a batch may leave with nothing live, skipping any an
-- append holds now. A campaign row may be deleted only under this lock: an append that comes
-- later waits for the batch to commit, then creates a fresh campaign row; one in flight keeps
-- the campaign row (due now, head 0: the next claim reads the campaign from its start). A
-- campaign with no head row (journal rows written by another tool) has no append to wait for.
WITH held AS (
    SELECT h.campaign_id FROM campaign_heads h
    WHERE h.campaign_id = ANY ($1::text[])
    ORDER BY h.campaign_id
    FOR SHARE SKIP LOCKED
)
SELECT campaign_id FROM held
UNION ALL
SELECT t.campaign_id FROM unnest($1::text[]) AS t(campaign_id)
WHERE NOT EXISTS (SELECT 1 FROM campaign_heads h WHERE h.campaign_id = t.campaign_id)

-- name: settle
-- The end of a batch in one statement. Delete completed rows ($1, $2). Record failures from
-- arrays ($3..$8): attempts, status (failed or dead), the next attempt at now + delay, the
-- error. Write each campaign's row ($10..$14): delete it when the batch left it nothing live
-- (gone: its append head is held, and no row at or past head_seq, the first seq the batch did
-- not see, exists now), else set its head, blocked flag and due time (the failure's next
-- attempt when the head is a row this batch failed, else the given instant, else now). Move the checkpoints
-- of ordered projectors ($15..$17, sorted: a fixed lock order). Returns how many
-- campaigns are left due now with a head to take (head 0: waiting for an append in flight),
-- so the worker claims again instead of sleeping, and the seconds each deleted row waited
-- since it was enqueued (for the append-to-apply metric). $9 = now.
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
(SELECT array_agg(age) FROM done) AS ages

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

-- name: next_due_in
-- Seconds until the earliest claimable work is due, by the database clock (null: nothing
-- waits): the first unblocked campaign under ordering `campaign`, the first live row under
-- ordering `none` ($1).
SELECT extract(epoch FROM CASE
    WHEN $1::boolean THEN (
        SELECT min(o.next_attempt_at) FROM projection_apply_outbox o
        WHERE o.status IN ('pending', 'failed'))
    ELSE (SELECT min(c.due_at) FROM projection_apply_campaigns c WHERE NOT c.blocked)
END - clock_timestamp())::double precision

-- name: outstanding_upto
-- Whether any work row of campaign $1 at or below seq $2 is still outstanding.
SELECT EXISTS (
    SELECT 1 FROM projection_apply_outbox WHERE campaign_id = $1::text AND seq <= $2::bigint
)

-- name: claim_one
-- Lock one queue row and its campaign without waiting (a row or campaign a running batch
-- holds raises 55P03) and load its event; blocked_by is the earliest earlier outstanding row
-- of its campaign (dead rows do not count under park, $3).
WITH held AS (
    SELECT 1 FROM projection_apply_campaigns WHERE campaign_id = $1::text FOR UPDATE NOWAIT
)
SELECT o.campaign_id, o.seq, o.status, o.attempt_count, o.next_attempt_at, true AS due,
       o.lease_owner, o.claim_epoch, NULL::bigint AS first_seq, NULL::bigint AS last_seq,
       j.event_type, j.payload::text AS payload, j.metadata::text AS metadata, j.recorded_at,
       (SELECT min(e.seq) FROM projection_apply_outbox e
        WHERE e.campaign_id = o.campaign_id AND e.seq < o.seq
          AND NOT ($3::boolean AND e.status = 'dead')) AS blocked_by,
       (SELECT count(*) FROM held) AS campaign_held
FROM projection_apply_outbox o
LEFT JOIN event_journal j ON j.campaign_id = o.campaign_id AND j.seq = o.seq
WHERE o.campaign_id = $1::text AND o.seq = $2::bigint
FOR UPDATE OF o NOWAIT

-- name: hold_campaign
-- Lock one campaign's queue row (waiting for a batch that holds it), before anything else of the
-- campaign: the order a batch takes them in (campaign row, then checkpoints and work rows).
SELECT 1 FROM projection_apply_campaigns WHERE campaign_id = $1::text FOR UPDATE

-- name: lock_campaign_rows
-- Hold a campaign and every queued row of it (waiting for a batch that has them), so no
-- worker applies the campaign while a rebuild runs. The campaign row first, as a worker takes
-- them: the rows' lateral depends on it.
WITH held AS (
    SELECT count(*) AS n FROM (
        SELECT 1 FROM projection_apply_campaigns WHERE campaign_id = $1::text FOR UPDATE
    ) c
)
SELECT count(*) AS locked
FROM held
CROSS JOIN LATERAL (
    SELECT 1 FROM projection_apply_outbox o
    WHERE o.campaign_id = $1::text AND held.n >= 0
    FOR UPDATE
) r

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
