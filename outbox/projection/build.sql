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

-- name: hold_failed_campaigns
-- Catch-up holds of projector $1 on campaigns $3 (each in its bucket of $2), left where their
-- checkpoints stand by a failing event, for the workers (outbox_hold_catch_ups): the holds
-- placed.
SELECT @extschema@.outbox_hold_catch_ups($1::text, $2::integer[], $3::text[])

-- name: list_queued_campaigns
-- Which of campaigns $2 (all in bucket $1) have work rows: a catch-up the workers run leaves
-- them to their claim.
SELECT DISTINCT o.campaign_id
FROM @extschema@.projection_apply_outbox o
WHERE o.bucket = $1::integer AND o.campaign_id = ANY ($2::text[])
