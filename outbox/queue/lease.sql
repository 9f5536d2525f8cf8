-- Lease mode (S13): rows of events a non-transactional projector handles are
-- leased by a batch, run outside any queue transaction, kept alive by heartbeats and ended by
-- a compare-and-set on owner, epoch and status. While a row is processing its next_attempt_at
-- equals lease_expires_at, so the ordinary claim takes it back when the lease expires. Every
-- statement names its bucket; instants come from statement_timestamp() and parameters, never
-- from a volatile function, and no stable function or operator (format, timestamptz +
-- interval) takes a column: Citus refuses both in a distributed UPDATE.

-- name: lease_rows
-- Lease rows ($1, $2) that a batch holds (its claim locked their campaigns) to owner $3 for $4
-- seconds, if each is still at the epoch the claim read ($5; null: never leased). A row whose
-- lease expired (reclaimed) counts that lease as an attempt and says so in last_error. Returns
-- the rows leased with their epoch, expiry and attempts. $6 = now; $7 their bucket.
UPDATE @extschema@.projection_apply_outbox o
SET status = 'processing',
    lease_owner = $3::text,
    claim_epoch = coalesce(o.claim_epoch, 0) + 1,
    leased_at = @extschema@.outbox_now($6::timestamptz),
    lease_expires_at = @extschema@.outbox_now($6::timestamptz)
        + make_interval(secs => $4::double precision),
    next_attempt_at = @extschema@.outbox_now($6::timestamptz)
        + make_interval(secs => $4::double precision),
    attempt_count = o.attempt_count + (o.status = 'processing')::integer,
    last_error = CASE WHEN o.status = 'processing'
        THEN 'lease expired: owner ' || o.lease_owner || ', epoch ' || o.claim_epoch::text
        ELSE o.last_error END,
    updated_at = @extschema@.outbox_now($6::timestamptz)
FROM unnest($1::text[], $2::bigint[], $5::bigint[]) AS l(campaign_id, seq, epoch)
WHERE o.bucket = $7::integer AND o.campaign_id = l.campaign_id AND o.seq = l.seq
  AND o.claim_epoch IS NOT DISTINCT FROM l.epoch
  AND o.status IN ('pending', 'failed', 'processing')
RETURNING o.campaign_id, o.seq, o.claim_epoch, o.lease_expires_at, o.attempt_count

-- name: extend_leases
-- Heartbeat: extend by $4 seconds the leases owner $1 still holds ($2, $3 with epochs $5);
-- returns those still held (a missing one was taken over or ended). All in bucket $6.
UPDATE @extschema@.projection_apply_outbox o
SET lease_expires_at = statement_timestamp() + make_interval(secs => $4::double precision),
    next_attempt_at = statement_timestamp() + make_interval(secs => $4::double precision)
FROM unnest($2::text[], $3::bigint[], $5::bigint[]) AS l(campaign_id, seq, epoch)
WHERE o.bucket = $6::integer AND o.campaign_id = l.campaign_id AND o.seq = l.seq
  AND o.claim_epoch = l.epoch AND o.lease_owner = $1::text AND o.status = 'processing'
RETURNING o.campaign_id, o.seq

-- name: complete_lease
-- The fenced end of a lease that succeeded: delete the row only while owner $3 at epoch $4
-- still holds it, returning the seconds since it was enqueued; no row back means the lease was
-- taken over and nothing changed. $5: the bucket.
-- (The age is taken outside the DELETE: Citus allows no clock in a RETURNING list.)
WITH gone AS (
    DELETE FROM @extschema@.projection_apply_outbox
    WHERE bucket = $5::integer AND campaign_id = $1::text AND seq = $2::bigint
      AND status = 'processing' AND lease_owner = $3::text AND claim_epoch = $4::bigint
    RETURNING enqueued_at
)
SELECT extract(epoch FROM statement_timestamp() - enqueued_at)::double precision AS age FROM gone

-- name: settle_lease
-- The fenced end of a lease whose row may stay: back to pending, for its holds (S24) to say
-- what it still owes (the caller's settle deletes it or works its columns out from them); only
-- while owner $3 at epoch $4 still holds it. Returns the seconds since it was enqueued; no
-- row back means the lease was taken over and nothing changed. $5: the bucket.
WITH ended AS (
    UPDATE @extschema@.projection_apply_outbox
    SET status = 'pending', lease_expires_at = NULL, next_attempt_at = statement_timestamp(),
        updated_at = statement_timestamp()
    WHERE bucket = $5::integer AND campaign_id = $1::text AND seq = $2::bigint
      AND status = 'processing' AND lease_owner = $3::text AND claim_epoch = $4::bigint
    RETURNING enqueued_at
)
SELECT extract(epoch FROM statement_timestamp() - enqueued_at)::double precision AS age
FROM ended

-- name: release_lease
-- Hand a lease back unfinished (the worker is stopping): due now, no attempt counted; only
-- while owner $3 at epoch $4 still holds it. $5: the bucket.
UPDATE @extschema@.projection_apply_outbox
SET status = CASE WHEN attempt_count > 0 THEN 'failed' ELSE 'pending' END,
    next_attempt_at = statement_timestamp(),
    lease_expires_at = NULL,
    updated_at = statement_timestamp()
WHERE bucket = $5::integer AND campaign_id = $1::text AND seq = $2::bigint AND status = 'processing'
  AND lease_owner = $3::text AND claim_epoch = $4::bigint
RETURNING true AS released
