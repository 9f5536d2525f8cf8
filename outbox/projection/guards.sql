-- The exactly-once guards: checkpoints of ordered projectors, processed markers of idempotent
-- ones, each read or written for a whole group of events in one statement. An ordered claim
-- locks the checkpoints in its own call (`outbox_claim`), and every checkpoint move is
-- written by the batch's settle (`outbox_settle`), so a worker's batch pays no statement of
-- its own for them; the checkpoints' functions, which both call, are in guards_fn.sql (S27).
-- Every statement runs in one bucket (the campaigns it names are all there), or, where it says
-- so, across buckets on one server (-1: each campaign's own, `outbox_bucket_in`).

-- name: lock_checkpoints
-- The checkpoints of the ordered projectors ($2) in the campaigns ($1, bucket $3 or -1), locked in a fixed
-- order until the transaction ends; a missing key means 0. One call per group: the verdicts
-- (apply / duplicate / gap) of every event follow from these values and the seqs.
SELECT campaign_id, projector, applied_seq
FROM @extschema@.outbox_lock_checkpoints($3::integer, $1::text[], $2::text[])

-- name: create_checkpoints
-- Checkpoint rows at 0 for the pairs of campaigns ($1, bucket $3 or -1) and ordered projectors ($2) that have
-- none, so a caller that does not hold the campaign has rows to lock: two concurrent first
-- applications of one campaign then queue on the row instead of both reading "missing".
-- Waits for a concurrent creator of the same row, then leaves its row as it is.
INSERT INTO @extschema@.projection_checkpoint_keys (bucket, campaign_id, projector, applied_seq)
SELECT @extschema@.outbox_bucket_in($3::integer, c), c, p, 0
FROM unnest($1::text[]) AS c, unnest($2::text[]) AS p
ORDER BY c, p
ON CONFLICT (bucket, campaign_id, projector) DO NOTHING

-- name: open_group
-- A savepoint around one group of events. Never released: a commit ends it, and a RELEASE
-- would cost the happy path a round trip.
SAVEPOINT outbox_group

-- name: undo_group
-- Roll back the group that just failed (the most recent savepoint of that name).
ROLLBACK TO SAVEPOINT outbox_group

-- name: reserve_markers
-- Reserve (handler, event) for every idempotent projector and event of a group in one
-- statement; the rows back are the reservations made now, the others were already applied.
-- A concurrent reserver of the same marker waits for the first to commit or roll back. All in
-- bucket $4 (or -1).
INSERT INTO @extschema@.processed_markers (bucket, campaign_id, seq, handler)
SELECT @extschema@.outbox_bucket_in($4::integer, r.campaign_id), r.campaign_id, r.seq, r.handler
FROM unnest($1::text[], $2::bigint[], $3::text[]) AS r(campaign_id, seq, handler)
ORDER BY r.campaign_id, r.seq, r.handler
ON CONFLICT (bucket, campaign_id, seq, handler) DO NOTHING
RETURNING campaign_id, seq, handler

-- name: list_checkpoints
-- Checkpoints of the given campaigns (all in bucket $2, or -1).
SELECT campaign_id, projector, applied_seq
FROM @extschema@.outbox_checkpoints_of($2::integer, $1::text[])

-- name: list_markers
-- Processed markers of the given events (all in bucket $3, or -1).
SELECT m.campaign_id, m.seq, m.handler
FROM @extschema@.processed_markers m
JOIN unnest($1::text[], $2::bigint[]) AS e(campaign_id, seq)
  ON m.bucket = @extschema@.outbox_bucket_in($3::integer, e.campaign_id)
 AND m.campaign_id = e.campaign_id AND m.seq = e.seq

-- name: delete_markers
-- A rebuild of an idempotent projector forgets what it applied in the campaign (bucket $3).
DELETE FROM @extschema@.processed_markers
WHERE bucket = $3::integer AND campaign_id = $1::text AND handler = $2::text

-- name: prune_markers
-- Processed markers older than $2 hours, of no handler in $1 (those catching up from the
-- journal), at most $3 per call (by key, not ctid: on Citus the inner select runs across
-- shards first, and a ctid means nothing outside its shard).
DELETE FROM @extschema@.processed_markers
WHERE (bucket, campaign_id, seq, handler) IN (
    SELECT bucket, campaign_id, seq, handler FROM @extschema@.processed_markers
    WHERE applied_at < statement_timestamp() - make_interval(hours => $2::integer)
      AND handler <> ALL ($1::text[])
    LIMIT $3::integer
)

-- name: get_projector_lag
-- How far ordered projector $1 stands behind the journal, counting the events of its own types
-- ($2) only: the campaigns where some event of its types lies past its checkpoint (no
-- checkpoint reads as 0), those events, and the age of the oldest (by the database clock);
-- and the journal's campaigns in all. The cost grows with the campaigns and the events behind:
-- one pass over the heads, one probe per campaign, a read of each behind range, grouped by
-- campaign as it is read (nothing materialized or sorted: a projector a million events behind
-- is counted in about a second; Citus pushes the grouping, by the distribution key, down to
-- the shards).
WITH behind AS MATERIALIZED (  -- each campaign's head worked out once, not per event
    SELECT h.bucket, h.campaign_id, h.last_seq, coalesce(k.applied_seq, 0) AS applied_seq
    FROM @extschema@.campaign_heads h
    LEFT JOIN @extschema@.projection_checkpoints k
        ON k.bucket = h.bucket AND k.campaign_id = h.campaign_id AND k.projector = $1::text
    WHERE h.last_seq > coalesce(k.applied_seq, 0)
), owed AS (
    SELECT e.bucket, e.campaign_id, count(*) AS events, min(e.recorded_at) AS oldest
    FROM behind b
    JOIN @extschema@.event_journal e
        ON e.bucket = b.bucket AND e.campaign_id = b.campaign_id
       AND e.seq > b.applied_seq AND e.seq <= b.last_seq
    WHERE e.event_type = ANY ($2::text[])
    GROUP BY e.bucket, e.campaign_id
)
SELECT count(*) AS campaigns_behind,
       coalesce(sum(o.events), 0)::bigint AS events_behind,
       extract(epoch FROM clock_timestamp() - min(o.oldest))::double precision
           AS oldest_unapplied_seconds,
       (SELECT count(*) FROM @extschema@.campaign_heads) AS campaigns
FROM owed o
