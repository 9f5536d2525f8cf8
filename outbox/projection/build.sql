-- The catch-up engine's statements (`build.py`, S30).

-- name: create_build_keys
-- The next $4 campaigns of bucket $2 after $3 (null: from the first) with projector $1's
-- checkpoint keys made (outbox_build_keys): run alone, committed before the step.
SELECT @extschema@.outbox_build_keys($1::text, $2::integer, $3::text, $4::integer)

-- name: lock_build_step
-- One step of projector $1's build in bucket $2 over campaigns $3 (outbox_build_step): each
-- campaign, whether the build holds its checkpoint now, its checkpoint and its head.
SELECT campaign_id, locked, applied_seq, last_seq
FROM @extschema@.outbox_build_step($1::text, $2::integer, $3::text[])

-- name: lock_build_bucket
-- Hold ($3 true) or let go of bucket $2 of projector $1's build, for this session: whether it
-- was had (outbox_lock_build_bucket).
SELECT @extschema@.outbox_lock_build_bucket($1::text, $2::integer, $3::boolean)

-- name: count_build_work
-- What projector $1 (of the types $2) lacks when a build starts: the events of its types past
-- its checkpoint in each campaign, or, for an in-place rebuild ($3), every event of its types
-- in a campaign it has not reset yet (after its bucket's resume point: $4, indexed by bucket
-- + 1, null for none), and those campaigns. One pass over the journal (an estimate for the
-- progress bar: appends go on meanwhile).
SELECT count(*) AS events, count(DISTINCT e.campaign_id) AS campaigns
FROM @extschema@.event_journal e
LEFT JOIN @extschema@.projection_checkpoints k
    ON k.bucket = e.bucket AND k.campaign_id = e.campaign_id AND k.projector = $1::text
WHERE e.event_type = ANY ($2::text[])
  AND (e.seq > coalesce(k.applied_seq, 0)
       OR ($3::boolean AND e.campaign_id > coalesce(($4::text[])[e.bucket + 1], '')))

-- name: set_build_count_unbounded
-- The count above is one pass over the journal, however long: no statement timeout for the
-- rest of its transaction.
SELECT set_config('statement_timeout', '0', true)
