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
j.event_type, j.payload::text AS payload, j.metadata::text AS metadata, j.recorded_at,
j.version

-- name: claim_batch
-- Ordering `campaign`, in bucket $1: up to $2 due campaigns locked (oldest due first, skipping
-- those other workers hold) and their rows from the head, at most $3 in all, with their events
-- and the checkpoints of the ordered projectors ($4), locked; $5 = now. One call, two
-- snapshots: the function (`outbox_claim`, claim_fn.sql) reads the rows in a statement after
-- the lock, so a campaign locked as its previous holder committed comes back as that holder
-- left it; $6: which campaigns ('all', 'live', 'holds': see the function). Columns as
-- `claim_due_rows`.
SELECT *
FROM @extschema@.outbox_claim($1::integer, $2::integer, $3::integer, $4::text[], $5::timestamptz,
                              $6::text)

-- name: claim_holds
-- A worker group's claim (S35): up to $2 due holds of its projectors ($1), with their
-- campaigns' checkpoints of them locked; $3 = now. Each campaign's checkpoints and holds.
SELECT campaign_id, projectors, applied_seqs, holds
FROM @extschema@.outbox_claim_holds($1::text[], $2::integer, $3::timestamptz)

-- name: get_group_due
-- Seconds until the earliest hold of projectors $1 that is not dead is due (at most 0: due
-- now; null: none), counting only those not due yet with $2: a worker group's loop's wait.
SELECT extract(epoch FROM min(h.next_attempt_at) - statement_timestamp())::double precision
FROM unnest($1::text[]) AS p(name)
CROSS JOIN LATERAL (
    SELECT x.next_attempt_at
    FROM @extschema@.projection_holds x
    WHERE x.projector = p.name AND x.status <> 'dead'
      AND (NOT $2::boolean OR x.next_attempt_at > statement_timestamp())
    ORDER BY x.next_attempt_at
    LIMIT 1
) h

-- name: claim_due_rows
-- Ordering `none`, in bucket $3: claim up to $1 due rows, oldest first, skipping rows other
-- workers hold. The locked rows come out of the claim itself (no second visit of the queue).
WITH o AS (
    SELECT x.campaign_id, x.seq, x.status, x.attempt_count, x.next_attempt_at, x.lease_owner,
           x.claim_epoch
    FROM @extschema@.projection_apply_outbox x
    WHERE x.bucket = $3::integer AND x.status IN ('pending', 'failed')
      AND x.next_attempt_at <= coalesce($2::timestamptz, statement_timestamp())
    ORDER BY x.next_attempt_at, x.seq
    LIMIT $1::integer
    FOR UPDATE OF x SKIP LOCKED
)
SELECT o.campaign_id, true AS due, NULL::bigint AS first_seq, NULL::bigint AS last_seq,
       NULL::text[] AS projectors, NULL::bigint[] AS applied_seqs, hd.holds,
       -- include: claimed_row
FROM o
CROSS JOIN LATERAL (
    -- The row's holds (S24), usually none, in the shape `outbox_claim` gives a campaign's.
    SELECT jsonb_agg(jsonb_build_object(
               'projector', h.projector, 'seq', h.seq, 'status', h.status,
               'attempts', h.attempt_count, 'next', h.next_attempt_at,
               'due', h.status <> 'dead'
                      AND h.next_attempt_at <= coalesce($2::timestamptz, statement_timestamp()))
               ORDER BY h.projector)::text AS holds
    FROM @extschema@.projection_holds h
    WHERE h.bucket = $3::integer AND h.campaign_id = o.campaign_id AND h.seq = o.seq
) hd
LEFT JOIN LATERAL (
    -- One index probe per claimed row. OFFSET 0 keeps this a probe: a generic plan guesses
    -- the claim's LIMIT at a tenth of the queue and would join the whole journal by hash.
    SELECT e.event_type, e.payload, e.metadata, e.recorded_at, e.version
    FROM @extschema@.event_journal e
    WHERE e.bucket = $3::integer AND e.campaign_id = o.campaign_id AND e.seq = o.seq
    OFFSET 0
) j ON true
ORDER BY o.campaign_id, o.seq

-- name: claim_one
-- Lock one queue row and its campaign without waiting (a row or campaign a running batch
-- holds raises 55P03) and load its event; blocked_by is the earliest earlier outstanding row
-- of its campaign (dead rows do not count under park, $3). $4: the campaign's bucket.
WITH held AS (
    SELECT 1 FROM @extschema@.projection_apply_campaigns
    WHERE bucket = $4::integer AND campaign_id = $1::text
    FOR UPDATE NOWAIT
)
SELECT o.campaign_id, true AS due, NULL::bigint AS first_seq, NULL::bigint AS last_seq,
       (SELECT min(e.seq) FROM @extschema@.projection_apply_outbox e
        WHERE e.bucket = $4::integer AND e.campaign_id = o.campaign_id AND e.seq < o.seq
          AND NOT ($3::boolean AND e.status = 'dead')) AS blocked_by,
       (SELECT count(*) FROM held) AS campaign_held,
       -- include: claimed_row
FROM @extschema@.projection_apply_outbox o
LEFT JOIN @extschema@.event_journal j
    ON j.bucket = $4::integer AND j.campaign_id = o.campaign_id AND j.seq = o.seq
WHERE o.bucket = $4::integer AND o.campaign_id = $1::text AND o.seq = $2::bigint
FOR UPDATE OF o NOWAIT

-- name: lock_heads
-- Hold the append heads of campaigns ($2, all in bucket $1) a batch or a repair may leave with
-- nothing live, skipping any an append holds now; a campaign with no head row counts as held
-- (`outbox_lock_heads`, claim_fn.sql, which the settle calls too).
SELECT campaign_id FROM @extschema@.outbox_lock_heads($1::integer, $2::text[])

-- name: hold_campaign
-- Lock one campaign's queue row (waiting for a batch that holds it), before anything else of the
-- campaign: the order a batch takes them in (campaign row, then checkpoints and work rows).
-- $2: the campaign's bucket.
SELECT 1 FROM @extschema@.projection_apply_campaigns
WHERE bucket = $2::integer AND campaign_id = $1::text
FOR UPDATE

-- name: lock_campaign_rows
-- Hold a campaign and every queued row of it (waiting for a batch that has them), so no
-- worker applies the campaign while a rebuild runs. The campaign row first, as a worker takes
-- them: the rows' lateral depends on it. $2: the campaign's bucket.
WITH held AS (
    SELECT count(*) AS n FROM (
        SELECT 1 FROM @extschema@.projection_apply_campaigns
        WHERE bucket = $2::integer AND campaign_id = $1::text
        FOR UPDATE
    ) c
)
SELECT count(*) AS locked
FROM held
CROSS JOIN LATERAL (
    SELECT 1 FROM @extschema@.projection_apply_outbox o
    WHERE o.bucket = $2::integer AND o.campaign_id = $1::text AND held.n >= 0
    FOR UPDATE
) r
