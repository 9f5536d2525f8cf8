-- Reads of the work queue: what the report, health, metrics, drains and read-your-writes see.
-- Every filter is a bound parameter; a null filter means "any". A campaign filter comes with
-- its bucket (the keys lead with it). Nothing here writes.

-- name: count_rows_by_status
-- Rows per status, optionally for one campaign ($1, in bucket $2).
SELECT status, count(*) AS n
FROM @extschema@.projection_apply_outbox
WHERE ($1::text IS NULL OR (bucket = $2::integer AND campaign_id = $1::text))
GROUP BY status

-- name: count_rows_bounded
-- Rows per status, each counted up to $1 rows (a count of $1 means "$1 or more"): what a page
-- refreshed every few seconds can afford at millions of rows. Pending rows are read from the
-- claim index or the table (whichever finds $1 soonest), the rare statuses from the attention
-- index alone.
SELECT (SELECT count(*) FROM (
            SELECT 1 FROM @extschema@.projection_apply_outbox WHERE status = 'pending' LIMIT $1::integer
        ) AS found) AS pending,
       (SELECT count(*) FROM (
            SELECT 1 FROM @extschema@.projection_apply_outbox
            WHERE status <> 'pending' AND status = 'processing' LIMIT $1::integer
        ) AS found) AS processing,
       (SELECT count(*) FROM (
            SELECT 1 FROM @extschema@.projection_apply_outbox
            WHERE status <> 'pending' AND status = 'failed' LIMIT $1::integer
        ) AS found) AS failed,
       (SELECT count(*) FROM (
            SELECT 1 FROM @extschema@.projection_apply_outbox
            WHERE status <> 'pending' AND status = 'dead' LIMIT $1::integer
        ) AS found) AS dead

-- name: get_oldest_claimable
-- The claimable row waiting longest (by enqueued_at, not by its backoff time) and its age by
-- the database clock: a pending or failed campaign head (campaign $1, or all). A row behind an
-- outstanding head of its campaign waits for that head and is not claimable; under park ($2)
-- dead rows step aside, so a head is the first row that is not dead. The heads are found by a
-- loose index scan per bucket (inspect_fn.sql), one descent of the primary key per campaign:
-- the cost grows with the campaigns that have work, not with their rows. $3: the bucket of
-- campaign $1.
SELECT h.campaign_id, h.seq, h.enqueued_at,
       extract(epoch FROM clock_timestamp() - h.enqueued_at)::double precision AS age_seconds
FROM @extschema@.outbox_oldest_claimable($1::text, $3::integer, $2::boolean) h
ORDER BY h.enqueued_at, h.seq
LIMIT 1

-- name: count_dead_rows
-- How many rows are dead (campaign $1, in bucket $2, or all).
SELECT count(*) FROM @extschema@.projection_apply_outbox
WHERE status = 'dead' AND ($1::text IS NULL OR (bucket = $2::integer AND campaign_id = $1::text))

-- name: get_earliest_next_attempt
-- The earliest next_attempt_at among claimable statuses, of campaign $1 (in bucket $2) or of
-- all (one probe per bucket, `outbox_due_buckets`).
SELECT CASE WHEN $1::text IS NULL
    THEN (SELECT min(d.due_at) FROM @extschema@.outbox_due_buckets(true, '-infinity') d)
    ELSE (SELECT min(o.next_attempt_at) FROM @extschema@.projection_apply_outbox o
          WHERE o.bucket = $2::integer AND o.campaign_id = $1::text
            AND o.status IN ('pending', 'failed'))
END

-- name: list_blocked_campaigns
-- Campaigns whose first outstanding row is failed or dead (under park, $2, dead rows step
-- aside and do not block), campaign $1 or all, with the rows waiting behind the head (counted
-- up to $4); the oldest head first, at most $3; `total` counts them all, whatever the limit.
-- Found from the attention index, bucket by bucket (inspect_fn.sql): each campaign's first
-- failed or dead row (a loose index scan), kept when nothing outstanding precedes it. The cost
-- grows with the campaigns that have failed or dead rows, not with the queue. $5: the bucket
-- of campaign $1. $6, $7: after that head time and campaign (a page's cursor; null: the
-- first page).
SELECT b.campaign_id, b.blocking_seq, b.status, b.waiting,
       extract(epoch FROM clock_timestamp() - b.enqueued_at)::double precision AS age_seconds,
       b.enqueued_at, b.total
FROM @extschema@.outbox_blocked_campaigns($1::text, $5::integer, $2::boolean, $3::integer, $4::integer,
                                          $6::timestamptz, $7::text) b
ORDER BY b.enqueued_at, b.campaign_id

-- name: list_failure_groups
-- Failed and dead rows grouped by status, projector and error shape (inspect_fn.sql): each
-- group's fingerprint, rows, event types, first and last failure, and its latest row with the
-- whole error. Reads at most $1 rows of the attention index ($2: one status, or both), so its
-- cost is bounded whatever the number of failures; `scanned` is how many it read (as many as
-- $1: there may be more). Largest groups first, at most $3.
WITH scanned AS (
    SELECT o.campaign_id, o.seq, o.status, o.event_type, o.last_error, o.updated_at,
           @extschema@.outbox_error_projector(o.last_error) AS projector,
           @extschema@.outbox_error_shape(o.last_error) AS shape
    FROM @extschema@.projection_apply_outbox o
    WHERE o.status <> 'pending' AND o.status IN ('failed', 'dead')
      AND ($2::text IS NULL OR o.status = $2::text)
    LIMIT $1::integer
)
SELECT s.status, s.projector, s.shape,
       @extschema@.outbox_error_fingerprint(s.projector, s.shape) AS fingerprint,
       count(*) AS rows,
       array_agg(DISTINCT s.event_type ORDER BY s.event_type) AS event_types,
       min(s.updated_at) AS first_at,
       max(s.updated_at) AS last_at,
       (array_agg(s.campaign_id ORDER BY s.updated_at DESC, s.campaign_id, s.seq))[1]
           AS latest_campaign_id,
       (array_agg(s.seq ORDER BY s.updated_at DESC, s.campaign_id, s.seq))[1] AS latest_seq,
       (array_agg(s.last_error ORDER BY s.updated_at DESC, s.campaign_id, s.seq))[1]
           AS latest_error,
       (SELECT count(*) FROM scanned) AS scanned
FROM scanned s
GROUP BY s.status, s.projector, s.shape
ORDER BY rows DESC, s.status, s.projector, s.shape
LIMIT $3::integer

-- name: list_rows
-- Queue rows by status ($1) and campaign ($2), at most $3: with no status filter failed and
-- dead rows first (they explain a backlog), then in claim order (next_attempt_at, seq). $4:
-- with each row's event payload (as text: an undecodable one still shows), one journal probe
-- per row listed; without it the journal is not read. $5: the bucket of campaign $2.
SELECT o.campaign_id, o.seq, o.event_type, o.status, o.attempt_count, o.next_attempt_at,
       o.enqueued_at, o.updated_at, o.last_error, j.payload
FROM @extschema@.projection_apply_outbox o
LEFT JOIN (SELECT bucket, campaign_id, seq, payload::text AS payload FROM @extschema@.event_journal) j
    ON $4::boolean AND j.bucket = o.bucket AND j.campaign_id = o.campaign_id AND j.seq = o.seq
WHERE ($1::text IS NULL OR o.status = $1::text)
  AND ($2::text IS NULL OR (o.bucket = $5::integer AND o.campaign_id = $2::text))
ORDER BY o.status IN ('failed', 'dead') DESC, o.next_attempt_at, o.seq
LIMIT $3::integer

-- name: list_leases
-- Rows in lease mode (processing): their owner and epoch (above 1: claimed before, a reclaim
-- when last_error says the lease expired), how long ago the lease was taken and when it
-- expires (negative: expired, due to be reclaimed), campaign $1 (in bucket $3), at most $2.
SELECT campaign_id, seq, event_type, lease_owner, claim_epoch, attempt_count, last_error,
       extract(epoch FROM statement_timestamp() - leased_at)::double precision
           AS lease_age_seconds,
       extract(epoch FROM lease_expires_at - statement_timestamp())::double precision
           AS expires_in_seconds
FROM @extschema@.projection_apply_outbox
WHERE status = 'processing'
  AND ($1::text IS NULL OR (bucket = $3::integer AND campaign_id = $1::text))
ORDER BY leased_at, campaign_id, seq
LIMIT $2::integer

-- name: get_shadow_observations
-- What shadow workers saw: rows seen, sightings, and the longest enqueue-to-first-seen lag, of
-- campaign $1 (in bucket $2) or all.
SELECT count(*) FILTER (WHERE seen_count > 0) AS rows_seen,
       coalesce(sum(seen_count), 0)::bigint AS sightings,
       max(extract(epoch FROM first_seen_at - enqueued_at))::double precision AS max_lag_seconds
FROM @extschema@.projection_apply_outbox
WHERE $1::text IS NULL OR (bucket = $2::integer AND campaign_id = $1::text)
