-- The journal's reads, and the pruning of expired append keys. The append itself is one call
-- of the append function (call.sql; the function is in call_fn.sql).

-- name: get_campaign_head
-- The last allocated seq of a campaign (no row: the campaign has no events). $2: its bucket.
SELECT last_seq FROM @extschema@.campaign_heads WHERE bucket = $2::integer AND campaign_id = $1::text

-- name: load_events
-- A campaign's events from seq $2 to $3, as projectors see them (payload and metadata as
-- text: `decode_event` decodes each one, so one undecodable event is that event's failure).
-- $4: the campaign's bucket.
SELECT seq, event_type, payload::text AS payload, metadata::text AS metadata, recorded_at,
       version
FROM @extschema@.event_journal
WHERE bucket = $4::integer AND campaign_id = $1::text AND seq BETWEEN $2::bigint AND $3::bigint
ORDER BY seq

-- name: load_ranges
-- Campaigns' events, campaign $2[i] from seq $3[i] to $4[i], in campaign and seq order, as
-- `load_events` reads them: what an ordered projector behind a campaign's first claimed row
-- applies first. $1: the bucket all the campaigns are in (-1: each its own, on one server).
SELECT j.campaign_id, j.seq, j.event_type, j.payload::text AS payload,
       j.metadata::text AS metadata, j.recorded_at, j.version
FROM unnest($2::text[], $3::bigint[], $4::bigint[]) AS r(campaign_id, lo, hi)
JOIN @extschema@.event_journal j
    ON j.bucket = @extschema@.outbox_bucket_in($1::integer, r.campaign_id)
   AND j.campaign_id = r.campaign_id AND j.seq BETWEEN r.lo AND r.hi
ORDER BY j.campaign_id, j.seq

-- name: load_typed_ranges
-- `load_ranges` of the events of types $5 alone, read by the journal's type index: what a
-- projector of those types applies of the ranges, however few of their positions they are
-- (outbox_typed_events).
SELECT campaign_id, seq, event_type, payload, metadata, recorded_at, version
FROM @extschema@.outbox_typed_events($1::integer, $2::text[], $3::bigint[], $4::bigint[],
                                     $5::text[])

-- name: count_typed_ranges
-- How many events of types $5 each range of `load_typed_ranges` holds (a campaign with none
-- left out), from the type index alone (outbox_typed_counts).
SELECT campaign_id, events
FROM @extschema@.outbox_typed_counts($1::integer, $2::text[], $3::bigint[], $4::bigint[],
                                     $5::text[])

-- name: list_campaigns
-- Campaigns with events, one ($1, in bucket $2) or all, in id order.
SELECT campaign_id FROM @extschema@.campaign_heads
WHERE $1::text IS NULL OR (bucket = $2::integer AND campaign_id = $1::text)
ORDER BY campaign_id

-- name: load_rebuild_events
-- The campaign's journal head and its events of the types ($2) a projector subscribes to,
-- up to that head, in seq order; both read in one snapshot, so the checkpoint set to the
-- head never passes an event the rebuild did not see. One row with null seq: no such events.
-- $3: the campaign's bucket.
WITH head AS (
    SELECT coalesce(max(seq), 0) AS last_seq FROM @extschema@.event_journal
    WHERE bucket = $3::integer AND campaign_id = $1::text
)
SELECT h.last_seq, e.seq, e.event_type, e.payload::text AS payload,
       e.metadata::text AS metadata, e.recorded_at, e.version
FROM head h
LEFT JOIN @extschema@.event_journal e
    ON e.bucket = $3::integer AND e.campaign_id = $1::text AND e.event_type = ANY ($2::text[]) AND e.seq <= h.last_seq
ORDER BY e.seq

-- name: prune_append_keys
-- Expired append idempotency keys, at most $1 per call (by key, not ctid: see prune_markers).
DELETE FROM @extschema@.append_idempotency_keys
WHERE (bucket, campaign_id, idem_key) IN (
    SELECT bucket, campaign_id, idem_key FROM @extschema@.append_idempotency_keys
    WHERE expires_at <= statement_timestamp()
    LIMIT $1::integer
)

-- name: list_recent_events
-- A campaign's last $2 events, newest first, payload and metadata as text (an undecodable one
-- still shows): the journal tail an operator reads beside the campaign's queue rows. $3: the
-- campaign's bucket.
SELECT seq, event_type, payload::text AS payload, metadata::text AS metadata, recorded_at
FROM @extschema@.event_journal
WHERE bucket = $3::integer AND campaign_id = $1::text
ORDER BY seq DESC
LIMIT $2::integer
