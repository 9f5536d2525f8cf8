-- Repairs of the work queue: dead rows back to pending and failed rows due now (audited), and
-- journal events that never got a work row enqueued.

-- name: list_repair_rows
-- Rows of status $10 ('dead' for a requeue, 'failed' for a retry) an operator names, oldest
-- first by next_attempt_at, seq, at most $1: a batch (campaign $2, event type $3, error
-- fingerprint $6: see inspect_fn.sql) or one row ($4, $5); $7: the bucket of the campaign or
-- row named; $8: only rows that projector's hold stands for with that status (S24); $9: only
-- rows that took that status at or before that time (null: any; a preview's rows, not those
-- since). A read: `repair_rows` takes them, bucket by bucket (a
-- statement that locks rows stays in one bucket).
SELECT o.bucket, o.campaign_id, o.seq, o.event_type, o.attempt_count, o.last_error,
       o.next_attempt_at, false AS grouped
FROM @extschema@.projection_apply_outbox o
WHERE o.status = $10::text AND ($7::integer IS NULL OR o.bucket = $7::integer)
  AND ($2::text IS NULL OR o.campaign_id = $2::text)
  AND ($3::text IS NULL OR o.event_type = $3::text)
  AND ($4::text IS NULL OR (o.campaign_id = $4::text AND o.seq = $5::bigint))
  AND ($6::text IS NULL OR @extschema@.outbox_error_fingerprint(
           @extschema@.outbox_error_projector(o.last_error),
           @extschema@.outbox_error_shape(o.last_error)) = $6::text)
  AND ($8::text IS NULL OR EXISTS (
      SELECT 1 FROM @extschema@.projection_holds h
      WHERE h.bucket = o.bucket AND h.campaign_id = o.campaign_id AND h.seq = o.seq
        AND h.projector = $8::text AND h.status = $10::text
  ))
  AND ($9::timestamptz IS NULL OR o.updated_at <= $9::timestamptz)
ORDER BY o.next_attempt_at, o.seq
LIMIT $1::integer

-- name: list_repair_group_holds
-- A worker group's holds (S35), which stand for no work row, as `list_repair_rows` lists rows
-- (the same parameters), each at the event it failed on (`from_seq`).
SELECT h.bucket, h.campaign_id, h.from_seq AS seq, j.event_type, h.attempt_count, h.last_error,
       h.next_attempt_at, true AS grouped
FROM @extschema@.projection_holds h
LEFT JOIN @extschema@.event_journal j
    ON j.bucket = h.bucket AND j.campaign_id = h.campaign_id AND j.seq = h.from_seq
WHERE h.seq = 0 AND h.from_seq IS NOT NULL AND h.status = $10::text
  AND ($7::integer IS NULL OR h.bucket = $7::integer)
  AND ($2::text IS NULL OR h.campaign_id = $2::text)
  AND ($3::text IS NULL OR j.event_type = $3::text)
  AND ($4::text IS NULL OR (h.campaign_id = $4::text AND h.from_seq = $5::bigint))
  AND ($6::text IS NULL OR @extschema@.outbox_error_fingerprint(
           @extschema@.outbox_error_projector(h.last_error),
           @extschema@.outbox_error_shape(h.last_error)) = $6::text)
  AND ($8::text IS NULL OR h.projector = $8::text)
  AND ($9::timestamptz IS NULL OR h.updated_at <= $9::timestamptz)
ORDER BY h.next_attempt_at, h.from_seq
LIMIT $1::integer

-- name: get_database_time
-- The database's clock now: what a preview's "dead at" is measured against.
SELECT clock_timestamp()

-- name: repair_holds
-- The holds (S24) of status $5 of rows ($2, $3), all in bucket $1, due now: projector $4's,
-- or every projector's (null). 'dead' (a requeue): back to pending with a fresh attempt
-- budget; 'failed' (a retry): their attempts kept. The caller holds the rows (`repair_rows`)
-- and then works their columns out from their holds.
UPDATE @extschema@.projection_holds h
SET status = CASE WHEN $5::text = 'dead' THEN 'pending' ELSE h.status END,
    attempt_count = CASE WHEN $5::text = 'dead' THEN 0 ELSE h.attempt_count END,
    next_attempt_at = statement_timestamp(), updated_at = statement_timestamp()
FROM unnest($2::text[], $3::bigint[]) AS k(campaign_id, seq)
WHERE h.bucket = $1::integer AND h.campaign_id = k.campaign_id AND h.seq = k.seq
  AND h.status = $5::text AND ($4::text IS NULL OR h.projector = $4::text)

-- name: repair_group_holds
-- A worker group's holds (S35) of status $5 on campaigns $2 at events $3, all in bucket $1,
-- due now: projector $4's, or any projector's (null); as `repair_holds` does. Holds other
-- transactions hold are skipped. Returns each as it was, for its audit row.
WITH target AS (
    SELECT h.campaign_id, h.projector, h.from_seq, h.status, h.attempt_count, h.last_error,
           h.next_attempt_at
    FROM @extschema@.projection_holds h
    JOIN unnest($2::text[], $3::bigint[]) AS k(campaign_id, seq)
        ON h.campaign_id = k.campaign_id AND h.from_seq = k.seq
    WHERE h.bucket = $1::integer AND h.seq = 0 AND h.status = $5::text
      AND ($4::text IS NULL OR h.projector = $4::text)
    FOR UPDATE OF h SKIP LOCKED
), moved AS (
    UPDATE @extschema@.projection_holds h
    SET status = CASE WHEN $5::text = 'dead' THEN 'pending' ELSE h.status END,
        attempt_count = CASE WHEN $5::text = 'dead' THEN 0 ELSE h.attempt_count END,
        next_attempt_at = statement_timestamp(), updated_at = statement_timestamp()
    FROM target t
    WHERE h.bucket = $1::integer AND h.campaign_id = t.campaign_id
      AND h.projector = t.projector AND h.seq = 0
)
SELECT t.campaign_id, t.from_seq AS seq, t.status, t.attempt_count, t.last_error,
       t.next_attempt_at, j.event_type
FROM target t
LEFT JOIN @extschema@.event_journal j
    ON j.bucket = $1::integer AND j.campaign_id = t.campaign_id AND j.seq = t.from_seq

-- name: repair_rows
-- Rows ($2, $3) of status $4, all in bucket $1, due now: 'dead' (a requeue) back to pending
-- with a fresh attempt budget, 'failed' (a retry) with their attempts and last error kept;
-- rows other transactions hold, or no longer of that status, are skipped. Returns each row as
-- it was, for its audit row (`insert_requeue_audit`, in the same transaction: on Citus the
-- audit is the coordinator's own table, and one statement must not write both).
WITH target AS (
    SELECT o.bucket, o.campaign_id, o.seq, o.event_type, o.status, o.attempt_count,
           o.last_error, o.next_attempt_at
    FROM @extschema@.projection_apply_outbox o
    JOIN unnest($2::text[], $3::bigint[]) AS k(campaign_id, seq)
        ON o.campaign_id = k.campaign_id AND o.seq = k.seq
    WHERE o.bucket = $1::integer AND o.status = $4::text
    FOR UPDATE OF o SKIP LOCKED
), moved AS (
    UPDATE @extschema@.projection_apply_outbox o
    SET status = CASE WHEN $4::text = 'dead' THEN 'pending' ELSE o.status END,
        attempt_count = CASE WHEN $4::text = 'dead' THEN 0 ELSE o.attempt_count END,
        next_attempt_at = statement_timestamp(), updated_at = statement_timestamp()
    FROM target t
    WHERE o.bucket = $1::integer AND o.campaign_id = t.campaign_id AND o.seq = t.seq
    RETURNING o.campaign_id, o.seq
)
SELECT t.campaign_id, t.seq, t.event_type, t.status, t.attempt_count, t.last_error,
       t.next_attempt_at
FROM target t JOIN moved m ON m.campaign_id = t.campaign_id AND m.seq = t.seq

-- name: insert_requeue_audit
-- The audit rows of requeued rows ($3..$8: campaign, seq, and what each was), actor $1,
-- reason $2, projector $9 (null: all of the row's), action $10 (null: requeue; or discard,
-- retry).
INSERT INTO @extschema@.outbox_requeue_audit (campaign_id, seq, actor, reason, previous_status,
    previous_attempt_count, previous_last_error, previous_next_attempt_at, projector, action)
SELECT a.campaign_id, a.seq, $1::text, $2::text, a.status, a.attempt_count, a.last_error,
       a.next_attempt_at, $9::text, coalesce($10::text, 'requeue')
FROM unnest($3::text[], $4::bigint[], $5::text[], $6::integer[], $7::text[],
            $8::timestamptz[]) AS a(campaign_id, seq, status, attempt_count, last_error,
                                    next_attempt_at)

-- name: list_unqueued_events
-- Journal events with no work row, after the keyset cursor ($5, $2, $3: bucket, campaign, seq),
-- one campaign ($1) or all, in (bucket, campaign_id, seq) order, at most $4.
SELECT j.bucket, j.campaign_id, j.seq, j.event_type
FROM @extschema@.event_journal j
WHERE ($1::text IS NULL OR j.campaign_id = $1::text)
  AND (j.bucket, j.campaign_id, j.seq) > ($5::integer, $2::text, $3::bigint)
  AND NOT EXISTS (
      SELECT 1 FROM @extschema@.projection_apply_outbox o
      WHERE o.bucket = j.bucket AND o.campaign_id = j.campaign_id AND o.seq = j.seq
  )
ORDER BY j.bucket, j.campaign_id, j.seq
LIMIT $4::integer

-- name: lock_heads_exclusively
-- Hold the append heads of campaigns $1 (all in bucket $2) FOR NO KEY UPDATE before making
-- their work rows: appends and refreshes wait, batches skip them (S26). Then hold_campaigns,
-- in a statement of its own that sees a campaign row an append made meanwhile.
SELECT count(*) FROM (
    SELECT 1 FROM @extschema@.campaign_head_keys h
    WHERE h.bucket = $2::integer AND h.campaign_id = ANY ($1::text[])
    ORDER BY h.campaign_id
    FOR NO KEY UPDATE
) h

-- name: hold_campaigns
-- Hold the campaign rows of campaigns $1 (all in bucket $2), waiting for a batch that holds
-- one: after their heads (lock_heads_exclusively), so no append waits for us while we wait
-- for it. A work row is made only under both (S26).
SELECT count(*) FROM (
    SELECT 1 FROM @extschema@.projection_apply_campaigns c
    WHERE c.bucket = $2::integer AND c.campaign_id = ANY ($1::text[])
    ORDER BY c.campaign_id
    FOR UPDATE
) c

-- name: insert_work_rows
-- Work rows for the given events, all in bucket $4, under hold_campaigns: an
-- existing row, in any slot, wins (enqueueing twice is a no-op).
INSERT INTO @extschema@.projection_apply_outbox (bucket, campaign_id, seq, event_type)
SELECT $4::integer, e.campaign_id, e.seq, e.event_type
FROM unnest($1::text[], $2::bigint[], $3::text[]) AS e(campaign_id, seq, event_type)
WHERE NOT EXISTS (
    SELECT 1 FROM @extschema@.projection_apply_outbox o
    WHERE o.bucket = $4::integer AND o.campaign_id = e.campaign_id AND o.seq = e.seq
)

-- name: list_unqueued_campaigns
-- Campaigns ($1, or all) with live work rows but no campaign row: rows written around the
-- append function (by hand, by a tool, a partial restore). Scans the work rows: a repair,
-- never a worker's statement.
SELECT DISTINCT o.campaign_id
FROM @extschema@.projection_apply_outbox o
WHERE o.status IN ('pending', 'failed')
  AND ($1::text IS NULL OR o.campaign_id = $1::text)
  AND NOT EXISTS (
      SELECT 1 FROM @extschema@.projection_apply_campaigns c
      WHERE c.bucket = o.bucket AND c.campaign_id = o.campaign_id
  )
ORDER BY o.campaign_id

-- name: discard_dead_row
-- Delete one dead work row ($1, $2) and write its audit row (actor $3, reason $4) keeping what
-- it was; the event stays in the journal. Returns the row as it was (no row: it is not there,
-- or not dead). The caller holds the campaign and the row (`claim_one`). $5: the bucket.
WITH gone AS (
    DELETE FROM @extschema@.projection_apply_outbox
    WHERE bucket = $5::integer AND campaign_id = $1::text AND seq = $2::bigint AND status = 'dead'
    RETURNING campaign_id, seq, event_type, status, attempt_count, last_error, next_attempt_at
), audit AS (
    INSERT INTO @extschema@.outbox_requeue_audit (campaign_id, seq, action, actor, reason, previous_status,
        previous_attempt_count, previous_last_error, previous_next_attempt_at)
    SELECT g.campaign_id, g.seq, 'discard', $3::text, $4::text, g.status, g.attempt_count,
           g.last_error, g.next_attempt_at
    FROM gone g
)
SELECT campaign_id, seq, event_type, attempt_count, last_error, next_attempt_at FROM gone

-- name: list_audit
-- Operators' actions on work rows, newest first: campaign $1 (or all), at most $2, older
-- than entry ($3, $4) (a page's cursor: its time and id; null: from the newest). Each with
-- what the row was before (status, attempts, last error) and the projector it was for (null:
-- all of the row's). `action`: requeue or discard.
SELECT a.action, a.at, a.campaign_id, a.seq, a.actor, a.reason,
       a.previous_status, a.previous_attempt_count, a.previous_last_error, a.projector,
       a.audit_id
FROM @extschema@.outbox_requeue_audit a
WHERE ($1::text IS NULL OR a.campaign_id = $1::text)
  AND ($3::timestamptz IS NULL OR (a.at, a.audit_id) < ($3::timestamptz, $4::bigint))
ORDER BY a.at DESC, a.audit_id DESC
LIMIT $2::integer
