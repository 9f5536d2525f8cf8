-- The consumer dedup guard: one claim per (scope, event_id, bucket), the bucket
-- being the Monday (UTC) of the event's own week, computed by the caller.

-- name: claim_event
-- Claim an event for a scope; a row back means this call won, none means it was claimed before.
-- A concurrent claim of the same key waits for this one's transaction and then gets no row.
INSERT INTO @extschema@.consumer_claims AS c
    (scope, event_id, bucket, event_time, source_topic, source_partition, source_offset)
VALUES ($1::text, $2::text, $3::date, $4::timestamptz, $5::text, $6::integer, $7::bigint)
ON CONFLICT (scope, event_id, bucket) DO NOTHING
RETURNING true AS claimed

-- name: release_event
-- Undo a claim, so a redelivery of the event is processed again.
DELETE FROM @extschema@.consumer_claims
WHERE scope = $1::text AND event_id = $2::text AND bucket = $3::date
RETURNING true AS released

-- name: prune_consumer_claims
-- Consumer claims whose week ended more than $1 days ago, at most $2 per call. The week ends
-- seven days after its Monday 00:00 UTC, whatever the session's TimeZone. By key, not ctid
-- (see prune_markers); the clock is on the constant side, so Citus evaluates it once.
DELETE FROM @extschema@.consumer_claims
WHERE (scope, event_id, bucket) IN (
    SELECT scope, event_id, bucket FROM @extschema@.consumer_claims
    WHERE (bucket + 7)::timestamp
          < (statement_timestamp() - make_interval(days => $1::integer)) AT TIME ZONE 'UTC'
    LIMIT $2::integer
)
