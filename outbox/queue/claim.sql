-- The claim: which due campaigns (or rows) a batch takes, their rows and events, and the locks
-- that hold a campaign against other appliers.
-- Instants come from the database; `now` is a parameter only so tests can move time forward
-- without sleeping. The claims compare with statement_timestamp(): it is stable, so it bounds
-- the index scan (a volatile clock_timestamp() would only filter, and a claim would read every
-- not-yet-due entry).

-- fragment: claimed_row
-- A claimed work row (o) and its journal event (j) as the claim returns them; payload and
-- metadata as text, so the worker decodes each row on its own and an undecodable event fails
-- its row, never the claim.
o.seq, o.status, o.attempt_count, o.next_attempt_at, o.lease_owner, o.claim_epoch,
j.event_type, j.payload::text AS payload, j.metadata::text AS metadata, j.recorded_at

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
-- The claimed campaigns ($1, heads $3): each one's rows from its head in seq order, at most $4
-- each (the batch budget shared among them: one hot campaign gets all of it), with its first
-- and last outstanding seq (two index probes), the checkpoints of the ordered projectors ($2),
-- locked in a fixed order until the batch commits (a missing one means 0), and each row's
-- event. A campaign with no rows left comes back as one row with a null seq. A `processing`
-- row (lease mode) is due once its lease expired: its next_attempt_at is its lease expiry.
-- $5 = now.
WITH picked AS (
    SELECT p.campaign_id, p.head_seq
    FROM unnest($1::text[], $3::bigint[]) AS p(campaign_id, head_seq)
), checkpoints AS (
    -- include: locked_checkpoints
)
SELECT p.campaign_id,
       o.status IN ('pending', 'failed', 'processing')
           AND o.next_attempt_at <= coalesce($5::timestamptz, statement_timestamp()) AS due,
       b.first_seq, b.last_seq, k.projectors, k.applied_seqs,
       -- include: claimed_row
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
    LIMIT $4::integer
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
SELECT c.campaign_id, true AS due, NULL::bigint AS first_seq, NULL::bigint AS last_seq,
       NULL::text[] AS projectors, NULL::bigint[] AS applied_seqs,
       -- include: claimed_row
FROM claimed c
JOIN projection_apply_outbox o ON o.campaign_id = c.campaign_id AND o.seq = c.seq
LEFT JOIN event_journal j ON j.campaign_id = c.campaign_id AND j.seq = c.seq
ORDER BY c.campaign_id, c.seq

-- name: claim_one
-- Lock one queue row and its campaign without waiting (a row or campaign a running batch
-- holds raises 55P03) and load its event; blocked_by is the earliest earlier outstanding row
-- of its campaign (dead rows do not count under park, $3).
WITH held AS (
    SELECT 1 FROM projection_apply_campaigns WHERE campaign_id = $1::text FOR UPDATE NOWAIT
)
SELECT o.campaign_id, true AS due, NULL::bigint AS first_seq, NULL::bigint AS last_seq,
       (SELECT min(e.seq) FROM projection_apply_outbox e
        WHERE e.campaign_id = o.campaign_id AND e.seq < o.seq
          AND NOT ($3::boolean AND e.status = 'dead')) AS blocked_by,
       (SELECT count(*) FROM held) AS campaign_held,
       -- include: claimed_row
FROM projection_apply_outbox o
LEFT JOIN event_journal j ON j.campaign_id = o.campaign_id AND j.seq = o.seq
WHERE o.campaign_id = $1::text AND o.seq = $2::bigint
FOR UPDATE OF o NOWAIT

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
