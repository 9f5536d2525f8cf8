-- Operator queries: the report, requeues and their audit. Every filter is a bound parameter;
-- a null filter means "any".

-- name: count_by_status
-- Rows per status, optionally for one campaign ($1).
SELECT status, count(*) AS n
FROM projection_apply_outbox
WHERE ($1::text IS NULL OR campaign_id = $1::text)
GROUP BY status

-- name: oldest_claimable
-- The claimable row waiting longest (by enqueued_at, not by its backoff time) and its age by
-- the database clock: a pending or failed campaign head. A row behind an outstanding head of
-- its campaign waits for that head and is not claimable (under park, $2, dead rows step aside).
WITH heads AS (
    SELECT DISTINCT ON (campaign_id) campaign_id, seq, status, enqueued_at
    FROM projection_apply_outbox
    WHERE ($1::text IS NULL OR campaign_id = $1::text) AND NOT ($2::boolean AND status = 'dead')
    ORDER BY campaign_id, seq
)
SELECT campaign_id, seq, enqueued_at,
       extract(epoch FROM clock_timestamp() - enqueued_at)::double precision AS age_seconds
FROM heads
WHERE status IN ('pending', 'failed')
ORDER BY enqueued_at, seq
LIMIT 1

-- name: dead_rows
-- How many rows are dead (campaign $1 or all).
SELECT count(*) FROM projection_apply_outbox
WHERE status = 'dead' AND ($1::text IS NULL OR campaign_id = $1::text)

-- name: earliest_next_attempt
-- The earliest next_attempt_at among claimable statuses.
SELECT min(next_attempt_at)
FROM projection_apply_outbox
WHERE status IN ('pending', 'failed') AND ($1::text IS NULL OR campaign_id = $1::text)

-- name: blocked_campaigns
-- Campaigns whose first outstanding row is failed or dead (under park, $2, dead rows step
-- aside and do not block), with the rows waiting behind it; oldest first, at most $3;
-- `total` counts them all, whatever the limit.
WITH heads AS (
    SELECT DISTINCT ON (campaign_id) campaign_id, seq, status, enqueued_at
    FROM projection_apply_outbox
    WHERE ($1::text IS NULL OR campaign_id = $1::text) AND NOT ($2::boolean AND status = 'dead')
    ORDER BY campaign_id, seq
)
SELECT h.campaign_id, h.seq AS blocking_seq, h.status,
       (SELECT count(*) FROM projection_apply_outbox o
        WHERE o.campaign_id = h.campaign_id AND o.seq > h.seq) AS waiting,
       extract(epoch FROM clock_timestamp() - h.enqueued_at)::double precision AS age_seconds,
       count(*) OVER () AS total
FROM heads h
WHERE h.status IN ('failed', 'dead')
ORDER BY h.enqueued_at, h.campaign_id
LIMIT $3::integer

-- name: list_rows
-- Queue rows by status ($1) and campaign ($2), at most $3: with no status filter failed and
-- dead rows first (they explain a backlog), then in claim order (next_attempt_at, seq).
SELECT campaign_id, seq, event_type, status, attempt_count, next_attempt_at, enqueued_at,
       updated_at, last_error
FROM projection_apply_outbox
WHERE ($1::text IS NULL OR status = $1::text) AND ($2::text IS NULL OR campaign_id = $2::text)
ORDER BY status IN ('failed', 'dead') DESC, next_attempt_at, seq
LIMIT $3::integer

-- name: list_leases
-- Rows in lease mode (processing): their owner and epoch (above 1: claimed before, a reclaim
-- when last_error says the lease expired), how long ago the lease was taken and when it
-- expires (negative: expired, due to be reclaimed), campaign $1, at most $2.
SELECT campaign_id, seq, event_type, lease_owner, claim_epoch, attempt_count, last_error,
       extract(epoch FROM clock_timestamp() - leased_at)::double precision AS lease_age_seconds,
       extract(epoch FROM lease_expires_at - clock_timestamp())::double precision
           AS expires_in_seconds
FROM projection_apply_outbox
WHERE status = 'processing' AND ($1::text IS NULL OR campaign_id = $1::text)
ORDER BY leased_at, campaign_id, seq
LIMIT $2::integer

-- name: requeue_dead_rows
-- Dead rows back to pending, due now, with a fresh attempt budget, oldest first by
-- next_attempt_at, seq: a batch (limit $1, campaign $2, event type $3) or one row ($4, $5).
-- Rows other transactions hold are skipped. $6 dry run: select, change nothing. Each requeue
-- writes its audit row (actor $7, reason $8) keeping the previous status, attempts and error.
WITH target AS (
    SELECT campaign_id, seq, event_type, status, attempt_count, last_error, next_attempt_at
    FROM projection_apply_outbox
    WHERE status = 'dead'
      AND ($2::text IS NULL OR campaign_id = $2::text)
      AND ($3::text IS NULL OR event_type = $3::text)
      AND ($4::text IS NULL OR (campaign_id = $4::text AND seq = $5::bigint))
    ORDER BY next_attempt_at, seq
    LIMIT $1::integer
    FOR UPDATE SKIP LOCKED
), moved AS (
    UPDATE projection_apply_outbox o
    SET status = 'pending', attempt_count = 0, next_attempt_at = clock_timestamp(),
        updated_at = clock_timestamp()
    FROM target t
    WHERE NOT $6::boolean AND o.campaign_id = t.campaign_id AND o.seq = t.seq
    RETURNING o.campaign_id, o.seq
), audit AS (
    INSERT INTO outbox_requeue_audit (campaign_id, seq, actor, reason, previous_status,
        previous_attempt_count, previous_last_error, previous_next_attempt_at)
    SELECT t.campaign_id, t.seq, $7::text, $8::text, t.status, t.attempt_count, t.last_error,
           t.next_attempt_at
    FROM target t JOIN moved m ON m.campaign_id = t.campaign_id AND m.seq = t.seq
)
SELECT t.campaign_id, t.seq, t.event_type, t.attempt_count, t.last_error, t.next_attempt_at
FROM target t
ORDER BY t.next_attempt_at, t.seq

-- name: prune_markers
-- Processed markers older than $1 hours, at most $2 per call.
DELETE FROM processed_markers
WHERE ctid IN (
    SELECT ctid FROM processed_markers
    WHERE applied_at < clock_timestamp() - make_interval(hours => $1::integer)
    LIMIT $2::integer
)

-- name: prune_append_keys
-- Expired append idempotency keys, at most $1 per call.
DELETE FROM append_idempotency_keys
WHERE ctid IN (
    SELECT ctid FROM append_idempotency_keys WHERE expires_at <= clock_timestamp() LIMIT $1::integer
)

-- name: prune_consumer_claims
-- Consumer claims whose week ended more than $1 days ago, at most $2 per call. The week ends
-- seven days after its Monday 00:00 UTC, whatever the session's TimeZone.
DELETE FROM consumer_claims
WHERE ctid IN (
    SELECT ctid FROM consumer_claims
    WHERE (bucket + 7)::timestamp AT TIME ZONE 'UTC'
          < clock_timestamp() - make_interval(days => $1::integer)
    LIMIT $2::integer
)

-- name: prune_workers
-- Worker registry rows stopped, or silent, for more than $1 hours, at most $2 per call.
DELETE FROM outbox_workers
WHERE ctid IN (
    SELECT ctid FROM outbox_workers
    WHERE coalesce(stopped_at, heartbeat_at) < clock_timestamp() - make_interval(hours => $1::integer)
    LIMIT $2::integer
)

-- name: shadow_observations
-- What shadow workers saw: rows seen, sightings, and the longest enqueue-to-first-seen lag.
SELECT count(*) FILTER (WHERE seen_count > 0) AS rows_seen,
       coalesce(sum(seen_count), 0)::bigint AS sightings,
       max(extract(epoch FROM first_seen_at - enqueued_at))::double precision AS max_lag_seconds
FROM projection_apply_outbox
WHERE $1::text IS NULL OR campaign_id = $1::text
