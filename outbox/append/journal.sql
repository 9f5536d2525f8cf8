-- The journal: seq allocation, journal and work-row inserts, append idempotency keys, and
-- the journal's reads.

-- name: append_events
-- One statement appends a batch: allocate seqs on the campaign head (checking expected_seq,
-- $5, when given), insert the journal rows and, when enqueueing ($6), their work rows, record
-- the result on the idempotency key ($7, may be null). The work rows' trigger (migration 0003)
-- keeps the campaign queue and wakes the workers when the campaign had no queued work.
-- No row comes back when expected_seq does not match; then nothing was written.
WITH moved AS (
    -- expected_seq > 0: the head must stand exactly there (re-checked after a lock wait).
    UPDATE campaign_heads AS h
    SET last_seq = h.last_seq + cardinality($2::text[]), updated_at = clock_timestamp()
    WHERE $5::bigint > 0 AND h.campaign_id = $1::text AND h.last_seq = $5::bigint
    RETURNING h.last_seq
), created AS (
    -- No expectation (create or advance), or expected_seq = 0 (the campaign must be new).
    INSERT INTO campaign_heads AS h (campaign_id, last_seq)
    SELECT $1::text, cardinality($2::text[])
    WHERE $5::bigint IS NULL OR $5::bigint = 0
    ON CONFLICT (campaign_id) DO UPDATE
        SET last_seq = h.last_seq + excluded.last_seq, updated_at = clock_timestamp()
        WHERE $5::bigint IS NULL
    RETURNING h.last_seq
), head AS (
    SELECT last_seq FROM moved UNION ALL SELECT last_seq FROM created
), journal AS (
    INSERT INTO event_journal (campaign_id, seq, event_type, payload, metadata)
    SELECT $1::text, head.last_seq - cardinality($2::text[]) + e.ord,
           e.event_type, e.payload::jsonb, e.metadata::jsonb
    FROM head, unnest($2::text[], $3::text[], $4::text[]) WITH ORDINALITY
        AS e(event_type, payload, metadata, ord)
    RETURNING campaign_id, seq, event_type
), work AS (
    INSERT INTO projection_apply_outbox (campaign_id, seq, event_type)
    SELECT campaign_id, seq, event_type FROM journal WHERE $6::boolean
), idem AS (
    UPDATE append_idempotency_keys AS k
    SET first_seq = head.last_seq - cardinality($2::text[]) + 1, last_seq = head.last_seq
    FROM head
    WHERE k.campaign_id = $1::text AND k.idem_key = $7::text
)
SELECT head.last_seq FROM head

-- name: claim_append_key
-- Take the idempotency key for this append, with the fingerprint of its events ($4): a new key,
-- or one whose TTL ran out. Blocks while a concurrent append holds the same key, so exactly one
-- of them appends. Returns no row when a live key exists.
INSERT INTO append_idempotency_keys AS k (campaign_id, idem_key, expires_at, fingerprint)
VALUES ($1::text, $2::text, clock_timestamp() + make_interval(secs => $3::double precision),
        $4::bytea)
ON CONFLICT (campaign_id, idem_key) DO UPDATE
    SET first_seq = NULL, last_seq = NULL, created_at = clock_timestamp(),
        expires_at = excluded.expires_at, fingerprint = excluded.fingerprint
    WHERE k.expires_at <= clock_timestamp()
RETURNING true AS claimed

-- name: get_append_key
-- The first result recorded under a live idempotency key, and the fingerprint of its events
-- (null for keys written before migration 0004).
SELECT first_seq, last_seq, fingerprint
FROM append_idempotency_keys
WHERE campaign_id = $1::text AND idem_key = $2::text

-- name: get_campaign_head
-- The last allocated seq of a campaign (no row: the campaign has no events).
SELECT last_seq FROM campaign_heads WHERE campaign_id = $1::text

-- name: load_events
-- A campaign's events from seq $2 to $3, as projectors see them (payload and metadata as
-- text: `decode_event` decodes each one, so one undecodable event is that event's failure).
SELECT seq, event_type, payload::text AS payload, metadata::text AS metadata, recorded_at
FROM event_journal
WHERE campaign_id = $1::text AND seq BETWEEN $2::bigint AND $3::bigint
ORDER BY seq

-- name: list_campaigns
-- Campaigns with events, one ($1) or all, in id order.
SELECT campaign_id FROM campaign_heads
WHERE $1::text IS NULL OR campaign_id = $1::text
ORDER BY campaign_id

-- name: load_rebuild_events
-- The campaign's journal head and its events of the types ($2) a projector subscribes to,
-- up to that head, in seq order; both read in one snapshot, so the checkpoint set to the
-- head never passes an event the rebuild did not see. One row with null seq: no such events.
WITH head AS (
    SELECT coalesce(max(seq), 0) AS last_seq FROM event_journal WHERE campaign_id = $1::text
)
SELECT h.last_seq, e.seq, e.event_type, e.payload::text AS payload,
       e.metadata::text AS metadata, e.recorded_at
FROM head h
LEFT JOIN event_journal e
    ON e.campaign_id = $1::text AND e.event_type = ANY ($2::text[]) AND e.seq <= h.last_seq
ORDER BY e.seq

-- name: prune_append_keys
-- Expired append idempotency keys, at most $1 per call.
DELETE FROM append_idempotency_keys
WHERE ctid IN (
    SELECT ctid FROM append_idempotency_keys WHERE expires_at <= clock_timestamp() LIMIT $1::integer
)
