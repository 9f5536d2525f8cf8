-- A campaign's bucket: how many buckets the install has.

-- name: get_bucket_count
-- How many buckets the campaign-keyed tables are split into (fixed at the first migrate).
SELECT @extschema@.outbox_bucket_count()
