-- Rows that need an operator (`attention.py`): failed and dead work rows, filtered and paged by
-- key, and one event with its work row, in full.

-- name: list_attention_rows
-- Failed, dead and leased rows ($1: one status, or all three) of event type $2, named projector $3 (the
-- error's), error group $4 (inspect_fn.sql's fingerprint) and campaign id prefix $5 (each
-- null: any), after key ($6, $7, $8) in key order (bucket, campaign, seq), at most $9; with
-- `total`, the matches counted from the start up to $10 (as many: there may be more). A
-- walk of the attention index (partial: failed, dead and leased rows only) from the key; the
-- filters read the row. With no row to show, one row of nulls but `total`.
WITH matching AS NOT MATERIALIZED (
    SELECT a.*, @extschema@.outbox_error_fingerprint(a.projector, a.shape) AS fingerprint
    FROM (
        SELECT o.bucket, o.campaign_id, o.seq, o.event_type, o.status, o.attempt_count,
               o.next_attempt_at, o.updated_at, o.last_error,
               @extschema@.outbox_error_projector(o.last_error) AS projector,
               @extschema@.outbox_error_shape(o.last_error) AS shape
        FROM @extschema@.projection_apply_outbox o
        WHERE o.status <> 'pending' AND o.status IN ('failed', 'dead', 'processing')
          AND ($1::text IS NULL OR o.status = $1::text)
          AND ($2::text IS NULL OR o.event_type = $2::text)
          AND ($5::text IS NULL OR starts_with(o.campaign_id, $5::text))
    ) a
    WHERE ($3::text IS NULL OR a.projector = $3::text)
      AND ($4::text IS NULL OR @extschema@.outbox_error_fingerprint(a.projector, a.shape) = $4::text)
)
SELECT c.total, p.bucket, p.campaign_id, p.seq, p.event_type, p.status, p.attempt_count,
       p.next_attempt_at, p.updated_at, p.last_error, p.projector, p.shape, p.fingerprint
FROM (SELECT count(*) AS total FROM (SELECT 1 FROM matching LIMIT $10::integer) x) c
LEFT JOIN LATERAL (
    SELECT m.* FROM matching m
    WHERE (m.bucket, m.campaign_id, m.seq) > ($6::integer, $7::text, $8::bigint)
    ORDER BY m.bucket, m.campaign_id, m.seq
    LIMIT $9::integer
) p ON true
ORDER BY p.bucket, p.campaign_id, p.seq

-- name: get_event_row
-- Event ($1, $2) of bucket $3 as the journal holds it (payload and metadata as text), with its
-- work row's state when it has one (null columns: none, it was applied or never queued).
SELECT j.campaign_id, j.seq, j.event_type, j.payload::text AS payload,
       j.metadata::text AS metadata, j.recorded_at,
       o.status, o.attempt_count, o.next_attempt_at, o.enqueued_at, o.updated_at, o.last_error
FROM @extschema@.event_journal j
LEFT JOIN @extschema@.projection_apply_outbox o
    ON o.bucket = j.bucket AND o.campaign_id = j.campaign_id AND o.seq = j.seq
WHERE j.bucket = $3::integer AND j.campaign_id = $1::text AND j.seq = $2::bigint

-- name: list_campaign_rows
-- Campaign $1's work rows (bucket $2) after seq $3 in seq order, at most $4, each with its
-- event's payload as text (one journal probe per row); with `total`, the campaign's rows
-- counted up to $5. Its primary key's range, whatever the rows' status. With no row to show,
-- one row of nulls but `total`.
SELECT c.total, p.campaign_id, p.seq, p.event_type, p.status, p.attempt_count,
       p.next_attempt_at, p.enqueued_at, p.updated_at, p.last_error, p.payload
FROM (
    SELECT count(*) AS total FROM (
        SELECT 1 FROM @extschema@.projection_apply_outbox o
        WHERE o.bucket = $2::integer AND o.campaign_id = $1::text
        LIMIT $5::integer
    ) x
) c
LEFT JOIN LATERAL (
    SELECT o.campaign_id, o.seq, o.event_type, o.status, o.attempt_count, o.next_attempt_at,
           o.enqueued_at, o.updated_at, o.last_error, j.payload::text AS payload
    FROM @extschema@.projection_apply_outbox o
    LEFT JOIN @extschema@.event_journal j
        ON j.bucket = o.bucket AND j.campaign_id = o.campaign_id AND j.seq = o.seq
    WHERE o.bucket = $2::integer AND o.campaign_id = $1::text AND o.seq > $3::bigint
    ORDER BY o.seq
    LIMIT $4::integer
) p ON true
ORDER BY p.seq
