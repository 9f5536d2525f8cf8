-- The worker registry (outbox_workers): what outbox-report shows as live workers.

-- name: register_worker
-- A worker process announces itself at start, with the projectors it runs ($6: projector ->
-- fingerprint, S33).
INSERT INTO @extschema@.outbox_workers (worker_id, host, pid, mode, concurrency, projectors)
VALUES ($1::text, $2::text, $3::integer, $4::text, $5::integer, $6::jsonb)
ON CONFLICT (worker_id) DO UPDATE
    SET heartbeat_at = clock_timestamp(), stopped_at = NULL, mode = excluded.mode,
        projectors = excluded.projectors

-- name: heartbeat_worker
-- Still alive, with its counters so far and the projectors it runs now ($3, as at start less
-- those an operator redefined since).
UPDATE @extschema@.outbox_workers
SET heartbeat_at = clock_timestamp(), counters = $2::jsonb, projectors = $3::jsonb
WHERE worker_id = $1::text

-- name: stop_worker
-- A clean shutdown, with the final counters.
UPDATE @extschema@.outbox_workers
SET stopped_at = clock_timestamp(), heartbeat_at = clock_timestamp(), counters = $2::jsonb
WHERE worker_id = $1::text

-- name: list_workers
-- Workers that heartbeated within $1 seconds and have not stopped (live or stale), oldest
-- first.
SELECT worker_id, host, pid, mode, concurrency, started_at, counters, projectors,
       extract(epoch FROM clock_timestamp() - heartbeat_at)::double precision AS heartbeat_age
FROM @extschema@.outbox_workers
WHERE stopped_at IS NULL
  AND heartbeat_at > clock_timestamp() - make_interval(secs => $1::double precision)
ORDER BY started_at, worker_id

-- name: prune_workers
-- Worker registry rows stopped, or silent, for more than $1 hours, at most $2 per call.
DELETE FROM @extschema@.outbox_workers
WHERE ctid IN (
    SELECT ctid FROM @extschema@.outbox_workers
    WHERE coalesce(stopped_at, heartbeat_at) < clock_timestamp() - make_interval(hours => $1::integer)
    LIMIT $2::integer
)
