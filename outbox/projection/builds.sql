-- The catch-up engine's record of its builds (`builds.py`, S30): progress and resume points.

-- name: get_build
-- Projector $1's latest build, as recorded (its counters are its buckets' parts).
SELECT b.kind, b.state, b.seconds
FROM @extschema@.outbox_builds b
WHERE b.projector = $1::text

-- name: create_build
-- Projector $1's build started afresh as kind $2, its totals not counted yet (a build
-- recorded before is replaced; its buckets' parts go with delete_build_buckets).
INSERT INTO @extschema@.outbox_builds AS b (projector, kind, state)
VALUES ($1::text, $2::text, 'running')
ON CONFLICT (projector) DO UPDATE
SET kind = excluded.kind, state = 'running', started_at = clock_timestamp(),
    updated_at = clock_timestamp(), events_total = 0, campaigns_total = 0, seconds = 0

-- name: resume_build
-- Projector $1's build that did not complete, running again.
UPDATE @extschema@.outbox_builds b
SET state = 'running', updated_at = clock_timestamp()
WHERE b.projector = $1::text

-- name: record_build_totals
-- Projector $1's build's totals, once counted: what it had done when it started and what it
-- lacked then ($2 events, $3 campaigns).
UPDATE @extschema@.outbox_builds b
SET events_total = $2::bigint, campaigns_total = $3::bigint
WHERE b.projector = $1::text

-- name: record_build_progress
-- Projector $1's build as it stands: state $2, $3 seconds of running (from its first start).
UPDATE @extschema@.outbox_builds b
SET state = $2::text, updated_at = clock_timestamp(), seconds = $3::float8
WHERE b.projector = $1::text

-- name: list_builds
-- Every projector's latest build with its counters (its totals, counted as it began, never
-- below what it did: appends since may pass them), and whether a build of it holds its lock
-- now (a `running` one that does not was killed): the advisory lock of
-- `outbox_lock_build_bucket`, bucket -1, as pg_locks shows a two-key lock (the keys as
-- unsigned oids, objsubid 2).
SELECT b.projector, b.kind, b.state, b.started_at, b.updated_at,
       greatest(b.events_total, c.events) AS events_total,
       greatest(b.campaigns_total, c.campaigns) AS campaigns_total,
       c.events, c.campaigns, c.skipped, c.failed, b.seconds,
       EXISTS (
           SELECT 1 FROM pg_catalog.pg_locks l
           WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2
             AND l.database = (SELECT d.oid FROM pg_catalog.pg_database d
                               WHERE d.datname = current_database())
             AND l.classid = (@extschema@.outbox_build_key(b.projector)::bigint & 4294967295)::oid
             AND l.objid = 4294967295::bigint::oid
       ) AS held
FROM @extschema@.outbox_builds b
LEFT JOIN (
    SELECT p.projector, sum(p.events)::bigint AS events, sum(p.campaigns)::bigint AS campaigns,
           sum(p.skipped)::bigint AS skipped, sum(p.failed)::bigint AS failed
    FROM @extschema@.outbox_build_buckets p
    GROUP BY p.projector
) c ON c.projector = b.projector
ORDER BY b.projector

-- name: list_build_buckets
-- Projector $1's build's part in each bucket: its counters and resume point.
SELECT p.bucket, p.after_campaign, p.events, p.campaigns, p.skipped, p.failed
FROM @extschema@.outbox_build_buckets p
WHERE p.projector = $1::text

-- name: record_build_bucket
-- Projector $1's build's part in bucket $2 as it stands after a step, in the step's
-- transaction: resume point $3, counters $4..$7.
INSERT INTO @extschema@.outbox_build_buckets AS p
    (projector, bucket, after_campaign, events, campaigns, skipped, failed)
VALUES ($1::text, $2::integer, $3::text, $4::bigint, $5::bigint, $6::bigint, $7::bigint)
ON CONFLICT (projector, bucket) DO UPDATE
SET after_campaign = excluded.after_campaign, events = excluded.events,
    campaigns = excluded.campaigns, skipped = excluded.skipped, failed = excluded.failed

-- name: delete_build_buckets
-- Projector $1's buckets' parts, when a new build of it starts.
DELETE FROM @extschema@.outbox_build_buckets p WHERE p.projector = $1::text

-- name: count_build_work
-- What projector $1 (of the types $2) lacks when a build of kind $3 starts, and over how many
-- campaigns: a catch-up, the events of its types past its checkpoint in each campaign; an
-- in-place rebuild, those and every event of its types in a campaign it has not reset yet
-- (after its bucket's resume point: $4, indexed by bucket + 1, null for none); a replay, every
-- event of its types after the resume points. One pass over the journal (an estimate for the
-- progress bar: appends go on meanwhile).
SELECT count(*) AS events, count(DISTINCT e.campaign_id) AS campaigns
FROM @extschema@.event_journal e
LEFT JOIN @extschema@.projection_checkpoints k
    ON k.bucket = e.bucket AND k.campaign_id = e.campaign_id AND k.projector = $1::text
WHERE e.event_type = ANY ($2::text[])
  AND CASE WHEN $3::text = 'replay'
           THEN e.campaign_id > coalesce(($4::text[])[e.bucket + 1], '')
           ELSE e.seq > coalesce(k.applied_seq, 0)
                OR ($3::text = 'in-place'
                    AND e.campaign_id > coalesce(($4::text[])[e.bucket + 1], ''))
      END

-- name: set_build_count_unbounded
-- The count above is one pass over the journal, however long: no statement timeout for the
-- rest of its transaction.
SELECT set_config('statement_timeout', '0', true)
