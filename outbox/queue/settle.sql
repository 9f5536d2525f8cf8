-- The end of a batch and the campaign queue's upkeep: settle (deletes, failures, campaign rows,
-- checkpoint moves in one call), refresh, unblock, wake-ups, shadow sightings.
-- Every statement names its bucket (a batch settles in one); instants come from the database:
-- coalesce($now, statement_timestamp()) in a statement that writes (a volatile clock there is
-- what Citus refuses to route).

-- name: settle_batch
-- The end of a batch in bucket $1 in one call (`outbox_settle`, settle_fn.sql), its work as one
-- JSON document ($2: done, failed, campaigns, checkpoints, now, notify, channel; sent as text,
-- which any pool passes as it is, whatever its jsonb codec): the append
-- heads of campaigns it left with nothing live held; the moved checkpoints written; then, in a
-- statement that sees every append committed before that, completed rows deleted, failures
-- recorded, the campaign rows written, and one NOTIFY when asked and rows were deleted.
-- Returns the campaigns left due now and each deleted row's seconds since it was enqueued.
SELECT due, ages FROM @extschema@.outbox_settle($1::integer, $2::text::jsonb)

-- name: refresh_campaigns
-- Campaign rows ($1) brought in line with their work rows and holds (`outbox_refresh_campaigns`,
-- settle_fn.sql); $2: park (no campaign blocked); a campaign left with nothing live is deleted
-- when its append head is held ($3). All in bucket $4.
SELECT @extschema@.outbox_refresh_campaigns($4::integer, $1::text[], $2::boolean, $3::text[])

-- name: unblock_campaigns
-- dead_policy=park: dead rows step aside, so no campaign is blocked (a fleet that ran with
-- block before leaves some marked).
UPDATE @extschema@.projection_apply_campaigns SET blocked = false, updated_at = statement_timestamp()
WHERE blocked

-- name: notify_work
-- A NOTIFY on channel $1 with payload $2: the workers' (after a requeue or a reconcile; appends
-- notify in their own call), naming a bucket or '' (look at every bucket), or the applied one
-- (after a lease completes).
SELECT pg_notify($1::text, $2::text)

-- name: record_observations
-- A shadow pass over claimed rows: count the sighting, stamp first and last seen, and look
-- again after $3 seconds (attempts, status and errors stay as they are). All in bucket $5.
UPDATE @extschema@.projection_apply_outbox o
SET seen_count = o.seen_count + 1,
    first_seen_at = least(o.first_seen_at, @extschema@.outbox_now($4::timestamptz)),
    last_seen_at = @extschema@.outbox_now($4::timestamptz),
    next_attempt_at = @extschema@.outbox_now($4::timestamptz) + make_interval(secs => $3::double precision)
FROM unnest($1::text[], $2::bigint[]) AS s(campaign_id, seq)
WHERE o.bucket = $5::integer AND o.campaign_id = s.campaign_id AND o.seq = s.seq

-- name: defer_campaigns
-- Campaigns $1 due again in $2 seconds by the database clock: their head waits for a paused
-- projector (no attempt counts). Run after the settle that wrote their rows, in its transaction.
-- All in bucket $3.
UPDATE @extschema@.projection_apply_campaigns
SET due_at = statement_timestamp() + make_interval(secs => $2::double precision),
    updated_at = statement_timestamp()
WHERE bucket = $3::integer AND campaign_id = ANY ($1::text[])

-- name: defer_rows
-- Work rows ($1, $2) due again in $3 seconds by the database clock, under ordering `none`:
-- their event waits for a paused projector (no attempt counts). All in bucket $4.
UPDATE @extschema@.projection_apply_outbox o
SET next_attempt_at = statement_timestamp() + make_interval(secs => $3::double precision),
    updated_at = statement_timestamp()
FROM unnest($1::text[], $2::bigint[]) AS d(campaign_id, seq)
WHERE o.bucket = $4::integer AND o.campaign_id = d.campaign_id AND o.seq = d.seq AND o.status IN ('pending', 'failed')
