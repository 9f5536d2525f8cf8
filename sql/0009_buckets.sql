-- Buckets: every campaign-keyed row carries `bucket = outbox_bucket(campaign_id)`, a number
-- in 0..N-1 fixed when this migration first runs, and every primary key, the work rows'
-- foreign key and the queue's indexes lead with it. A batch claims and settles in one bucket,
-- and every statement on these tables names its bucket, so on Citus (tables distributed by
-- `bucket`, co-located: `maintenance distribute`) each one runs on one shard, and on plain
-- PostgreSQL each one reads one bucket's part of an index.
--
-- N comes from the setting `outbox.buckets` (the migrator sets it from OUTBOX_BUCKETS; a
-- psql script sets it with SET), default 64, at most 4096. It is written into the two
-- functions below and never changes afterwards: a bucket is where a campaign's rows live.
-- On Citus a bucket is the unit that moves between nodes (shards move, buckets never do).
--
-- The rules the statements keep, so that one definition serves both servers (Citus refuses the
-- others): no volatile function in a statement that writes (each call takes its instant once,
-- into a variable or a parameter); a scalar bucket per statement (an array of buckets cannot
-- be routed under a generic plan); no wake-up from a trigger (the append's own session
-- sends the NOTIFY, whose payload is now the bucket, so a worker claims there first).

DO $$
DECLARE
    n integer := coalesce(nullif(current_setting('outbox.buckets', true), '')::integer, 64);
BEGIN
    IF n NOT BETWEEN 1 AND 4096 THEN
        RAISE EXCEPTION 'outbox.buckets must be between 1 and 4096, got %', n;
    END IF;
    EXECUTE format(
        'CREATE FUNCTION outbox_bucket_count() RETURNS integer '
        'LANGUAGE sql IMMUTABLE PARALLEL SAFE RETURN %s', n);
    -- The first 32 bits of the id's MD5 (UTF-8), modulo N: outbox.buckets.bucket_of in Python.
    EXECUTE format(
        'CREATE FUNCTION outbox_bucket(campaign_id text) RETURNS integer '
        'LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE '
        'RETURN ((''x'' || left(md5(campaign_id), 8))::bit(32)::bigint %% %s)::integer', n);
END
$$;

COMMENT ON FUNCTION outbox_bucket_count() IS
    'How many buckets the outbox''s campaign-keyed tables are split into; fixed at migration';
COMMENT ON FUNCTION outbox_bucket(text) IS
    'The bucket of a campaign: the first 32 bits of md5(campaign_id) modulo outbox_bucket_count()';

-- The column on every campaign-keyed table, filled in place, then the keys rebuilt around it.
-- This rewrites each table once, under locks that stop appends and workers: a maintenance
-- window, sized by the journal (docs/scaling.md).
ALTER TABLE event_journal ADD COLUMN bucket integer;
ALTER TABLE campaign_heads ADD COLUMN bucket integer;
ALTER TABLE projection_apply_outbox ADD COLUMN bucket integer;
ALTER TABLE projection_apply_campaigns ADD COLUMN bucket integer;
ALTER TABLE projection_checkpoints ADD COLUMN bucket integer;
ALTER TABLE processed_markers ADD COLUMN bucket integer;
ALTER TABLE append_idempotency_keys ADD COLUMN bucket integer;

UPDATE event_journal SET bucket = outbox_bucket(campaign_id);
UPDATE campaign_heads SET bucket = outbox_bucket(campaign_id);
UPDATE projection_apply_outbox SET bucket = outbox_bucket(campaign_id);
UPDATE projection_apply_campaigns SET bucket = outbox_bucket(campaign_id);
UPDATE projection_checkpoints SET bucket = outbox_bucket(campaign_id);
UPDATE processed_markers SET bucket = outbox_bucket(campaign_id);
UPDATE append_idempotency_keys SET bucket = outbox_bucket(campaign_id);

ALTER TABLE projection_apply_outbox
    DROP CONSTRAINT projection_apply_outbox_campaign_id_seq_fkey,
    DROP CONSTRAINT projection_apply_outbox_pkey;
DROP INDEX projection_apply_outbox_claim_idx;
DROP INDEX projection_apply_outbox_attention_idx;
DROP INDEX projection_apply_campaigns_claim_idx;

ALTER TABLE event_journal
    ALTER COLUMN bucket SET NOT NULL,
    ADD CONSTRAINT event_journal_bucket_check CHECK (bucket = outbox_bucket(campaign_id)),
    DROP CONSTRAINT event_journal_pkey,
    ADD PRIMARY KEY (bucket, campaign_id, seq);
ALTER TABLE campaign_heads
    ALTER COLUMN bucket SET NOT NULL,
    ADD CONSTRAINT campaign_heads_bucket_check CHECK (bucket = outbox_bucket(campaign_id)),
    DROP CONSTRAINT campaign_heads_pkey,
    ADD PRIMARY KEY (bucket, campaign_id);
ALTER TABLE projection_apply_outbox
    ALTER COLUMN bucket SET NOT NULL,
    ADD CONSTRAINT projection_apply_outbox_bucket_check
        CHECK (bucket = outbox_bucket(campaign_id)),
    ADD PRIMARY KEY (bucket, campaign_id, seq),
    ADD CONSTRAINT projection_apply_outbox_event_fkey FOREIGN KEY (bucket, campaign_id, seq)
        REFERENCES event_journal (bucket, campaign_id, seq);
ALTER TABLE projection_apply_campaigns
    ALTER COLUMN bucket SET NOT NULL,
    ADD CONSTRAINT projection_apply_campaigns_bucket_check
        CHECK (bucket = outbox_bucket(campaign_id)),
    DROP CONSTRAINT projection_apply_campaigns_pkey,
    ADD PRIMARY KEY (bucket, campaign_id);
ALTER TABLE projection_checkpoints
    ALTER COLUMN bucket SET NOT NULL,
    ADD CONSTRAINT projection_checkpoints_bucket_check
        CHECK (bucket = outbox_bucket(campaign_id)),
    DROP CONSTRAINT projection_checkpoints_pkey,
    ADD PRIMARY KEY (bucket, campaign_id, projector);
ALTER TABLE processed_markers
    ALTER COLUMN bucket SET NOT NULL,
    ADD CONSTRAINT processed_markers_bucket_check CHECK (bucket = outbox_bucket(campaign_id)),
    DROP CONSTRAINT processed_markers_pkey,
    ADD PRIMARY KEY (bucket, campaign_id, seq, handler);
ALTER TABLE append_idempotency_keys
    ALTER COLUMN bucket SET NOT NULL,
    ADD CONSTRAINT append_idempotency_keys_bucket_check
        CHECK (bucket = outbox_bucket(campaign_id)),
    DROP CONSTRAINT append_idempotency_keys_pkey,
    ADD PRIMARY KEY (bucket, campaign_id, idem_key);

-- The queue's indexes, as before, each within a bucket: a claim reads its bucket's due part.
CREATE INDEX projection_apply_outbox_claim_idx
    ON projection_apply_outbox (bucket, next_attempt_at, seq)
    WHERE status IN ('pending', 'failed');
CREATE INDEX projection_apply_outbox_attention_idx
    ON projection_apply_outbox (bucket, campaign_id, seq) INCLUDE (status)
    WHERE status <> 'pending';
CREATE INDEX projection_apply_campaigns_claim_idx
    ON projection_apply_campaigns (bucket, due_at)
    WHERE NOT blocked;

-- The append (migration 0006), per bucket: every statement names the campaign's bucket, takes
-- its instant from one clock reading, and the journal and work rows are two statements. The
-- NOTIFY's payload is the bucket.
CREATE OR REPLACE FUNCTION outbox_try_append(
    p_campaign_id text,
    p_events jsonb,
    p_expected_seq bigint DEFAULT NULL,
    p_idempotency_key text DEFAULT NULL,
    p_enqueue boolean DEFAULT NULL,
    p_key_ttl double precision DEFAULT NULL
) RETURNS TABLE (
    first_seq bigint, last_seq bigint, duplicate boolean, refusal text, field text,
    message text
)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    n integer;
    b integer;
    v_now timestamptz := clock_timestamp();
    bad text[];  -- {field, message} of the first rule broken
    bad_field text;
    bad_message text;
    enqueue boolean := coalesce(
        p_enqueue, nullif(current_setting('outbox.enqueue', true), '')::boolean, true);
    ttl double precision := coalesce(
        p_key_ttl, nullif(current_setting('outbox.append_key_ttl', true), '')::double precision,
        86400);
    appended jsonb;
    fp bytea;
    known_first bigint;
    known_last bigint;
    known_fp bytea;
    head bigint;
    earliest bigint;
BEGIN
    -- Every rule before any write; a refusal names the field (events[2].type).
    bad := CASE
        WHEN p_campaign_id IS NULL THEN ARRAY['campaign_id', 'expected a string']
        WHEN btrim(p_campaign_id) = '' THEN ARRAY['campaign_id', 'must not be empty']
        WHEN length(p_campaign_id) > 256 THEN ARRAY['campaign_id',
            format('must be at most 256 characters, got %s', length(p_campaign_id))]
        WHEN p_events IS NULL OR jsonb_typeof(p_events) <> 'array'
            THEN ARRAY['events', 'expected a JSON array of events']
        WHEN jsonb_array_length(p_events) = 0 THEN ARRAY['events', 'must not be empty']
        WHEN jsonb_array_length(p_events) > 10000 THEN ARRAY['events',
            format('at most 10000 per append, got %s', jsonb_array_length(p_events))]
        WHEN p_expected_seq < 0 THEN ARRAY['expected_seq',
            format('expected an integer >= 0, got %s', p_expected_seq)]
        WHEN btrim(p_idempotency_key) = '' THEN ARRAY['idempotency_key', 'must not be empty']
        WHEN length(p_idempotency_key) > 256 THEN ARRAY['idempotency_key',
            format('must be at most 256 characters, got %s', length(p_idempotency_key))]
    END;
    IF bad IS NULL THEN
        -- One pass over the events: the first broken rule, and the events as they are stored
        -- (the key travels in each event's metadata).
        SELECT jsonb_agg(jsonb_build_array(
                   value ->> 'type',
                   coalesce(value -> 'payload', 'null'::jsonb),
                   coalesce(nullif(value -> 'metadata', 'null'::jsonb), '{}'::jsonb)
                       || CASE WHEN p_idempotency_key IS NULL THEN '{}'::jsonb
                               ELSE jsonb_build_object('idempotency_key', p_idempotency_key)
                          END)
                   ORDER BY ord),
               (array_agg(format('events[%s]%s', ord - 1, broken[1]) ORDER BY ord)
                   FILTER (WHERE broken IS NOT NULL))[1],
               (array_agg(broken[2] ORDER BY ord) FILTER (WHERE broken IS NOT NULL))[1]
        INTO appended, bad_field, bad_message
        FROM (
            SELECT value, ord, CASE
                WHEN jsonb_typeof(value) <> 'object' THEN ARRAY['',
                    'expected an object with type, payload and optional metadata']
                WHEN value - ARRAY['type', 'payload', 'metadata'] <> '{}'::jsonb
                    THEN ARRAY['', 'expected only type, payload and metadata']
                WHEN jsonb_typeof(value -> 'type') IS DISTINCT FROM 'string'
                    THEN ARRAY['.type', 'expected a string']
                WHEN btrim(value ->> 'type') = '' THEN ARRAY['.type', 'must not be empty']
                WHEN length(value ->> 'type') > 256 THEN ARRAY['.type',
                    format('must be at most 256 characters, got %s', length(value ->> 'type'))]
                WHEN jsonb_typeof(value -> 'metadata') NOT IN ('object', 'null')
                    THEN ARRAY['.metadata', 'expected a mapping or None']
                WHEN p_idempotency_key IS NOT NULL
                  AND value -> 'metadata' ? 'idempotency_key'
                  AND value -> 'metadata' -> 'idempotency_key' <> to_jsonb(p_idempotency_key)
                    THEN ARRAY['.metadata', '''idempotency_key'' is set by the append from its '
                                            'idempotency_key; got a different value']
                WHEN octet_length((value -> 'payload')::text) > 1048576 THEN ARRAY['.payload',
                    format('encodes to %s bytes, more than 1048576',
                           octet_length((value -> 'payload')::text))]
            END AS broken
            FROM jsonb_array_elements(p_events) WITH ORDINALITY AS e(value, ord)
        ) e;
        bad := CASE WHEN bad_field IS NOT NULL THEN ARRAY[bad_field, bad_message] END;
    END IF;
    IF bad IS NOT NULL THEN
        RETURN QUERY SELECT NULL::bigint, NULL::bigint, false, 'invalid', bad[1], bad[2];
        RETURN;
    END IF;
    n := jsonb_array_length(p_events);
    b := outbox_bucket(p_campaign_id);

    IF p_idempotency_key IS NOT NULL THEN
        -- Take the key (a new one, or one whose TTL ran out); a concurrent append with the same
        -- key waits here, so exactly one of them appends.
        fp := outbox_fingerprint(appended);
        INSERT INTO append_idempotency_keys AS k
            (bucket, campaign_id, idem_key, created_at, expires_at, fingerprint)
        VALUES (b, p_campaign_id, p_idempotency_key, v_now,
                v_now + make_interval(secs => ttl), fp)
        ON CONFLICT (bucket, campaign_id, idem_key) DO UPDATE
            SET first_seq = NULL, last_seq = NULL, created_at = v_now,
                expires_at = excluded.expires_at, fingerprint = excluded.fingerprint
            WHERE k.expires_at <= v_now;
        IF NOT FOUND THEN  -- a live key: the first append's result, if the events match
            SELECT k.first_seq, k.last_seq, k.fingerprint
            INTO known_first, known_last, known_fp
            FROM append_idempotency_keys k
            WHERE k.bucket = b AND k.campaign_id = p_campaign_id
              AND k.idem_key = p_idempotency_key;
            IF known_fp IS NOT NULL AND known_fp <> fp THEN  -- keys from before 0004 have none
                RETURN QUERY SELECT known_first, known_last, false, 'key_conflict',
                    'idempotency_key'::text,
                    format('campaign %L: idempotency key %L already appended seqs %s..%s with '
                           'different events; a retry must send the same events, a new request '
                           'needs a new key', p_campaign_id, p_idempotency_key,
                           known_first, known_last);
                RETURN;
            END IF;
            RETURN QUERY SELECT known_first, known_last, true, NULL::text, NULL::text,
                NULL::text;
            RETURN;
        END IF;
    END IF;

    -- Seqs from the campaign head, which the append holds until commit (gap-free).
    IF p_expected_seq > 0 THEN  -- the head must stand exactly there (re-checked after a wait)
        UPDATE campaign_heads AS h
        SET last_seq = h.last_seq + n, updated_at = v_now
        WHERE h.bucket = b AND h.campaign_id = p_campaign_id AND h.last_seq = p_expected_seq
        RETURNING h.last_seq INTO head;
    ELSE  -- no expectation (create or advance), or expected_seq = 0 (the campaign must be new)
        INSERT INTO campaign_heads AS h (bucket, campaign_id, last_seq, updated_at)
        VALUES (b, p_campaign_id, n, v_now)
        ON CONFLICT (bucket, campaign_id) DO UPDATE
            SET last_seq = h.last_seq + excluded.last_seq, updated_at = v_now
            WHERE p_expected_seq IS NULL
        RETURNING h.last_seq INTO head;
    END IF;
    IF head IS NULL THEN
        IF p_idempotency_key IS NOT NULL THEN  -- the refused append takes its key back
            DELETE FROM append_idempotency_keys k
            WHERE k.bucket = b AND k.campaign_id = p_campaign_id
              AND k.idem_key = p_idempotency_key;
        END IF;
        SELECT coalesce(max(h.last_seq), 0) INTO head
        FROM campaign_heads h WHERE h.bucket = b AND h.campaign_id = p_campaign_id;
        RETURN QUERY SELECT NULL::bigint, head, false, 'expected_seq', 'expected_seq'::text,
            format('campaign %L: expected seq %s, head is %s',
                   p_campaign_id, p_expected_seq, head);
        RETURN;
    END IF;

    INSERT INTO event_journal (bucket, campaign_id, seq, event_type, payload, metadata,
                               recorded_at)
    SELECT b, p_campaign_id, head - n + e.ord, e.value ->> 0, e.value -> 1, e.value -> 2, v_now
    FROM jsonb_array_elements(appended) WITH ORDINALITY AS e(value, ord);

    IF enqueue THEN
        INSERT INTO projection_apply_outbox (bucket, campaign_id, seq, event_type,
                                             next_attempt_at, enqueued_at, updated_at)
        SELECT b, p_campaign_id, head - n + e.ord, e.value ->> 0, v_now, v_now, v_now
        FROM jsonb_array_elements(appended) WITH ORDINALITY AS e(value, ord);
        -- The campaign's queue row, unless it has one (DO NOTHING waits for no worker). A new
        -- one starts at the campaign's first row: rows from before (dead rows stepped over,
        -- rows a tool inserted) come first. That lookup is planned afresh (EXECUTE): a cached
        -- plan from an empty queue would scan a grown one.
        INSERT INTO projection_apply_campaigns AS c (bucket, campaign_id, head_seq, due_at,
                                                     updated_at)
        VALUES (b, p_campaign_id, head - n + 1, v_now, v_now)
        ON CONFLICT (bucket, campaign_id) DO NOTHING;
        IF FOUND THEN
            EXECUTE 'SELECT min(o.seq) FROM projection_apply_outbox o '
                    'WHERE o.bucket = $1 AND o.campaign_id = $2 AND o.seq < $3'
                INTO earliest USING b, p_campaign_id, head - n + 1;
            IF earliest IS NOT NULL THEN
                UPDATE projection_apply_campaigns c SET head_seq = earliest
                WHERE c.bucket = b AND c.campaign_id = p_campaign_id;
            END IF;
            -- A campaign the workers did not know has work: wake them, naming its bucket (at
            -- most once per append).
            PERFORM pg_notify('outbox_work', b::text);
        END IF;
    END IF;

    IF p_idempotency_key IS NOT NULL THEN
        UPDATE append_idempotency_keys k
        SET first_seq = head - n + 1, last_seq = head
        WHERE k.bucket = b AND k.campaign_id = p_campaign_id AND k.idem_key = p_idempotency_key;
    END IF;
    RETURN QUERY SELECT head - n + 1, head, false, NULL::text, NULL::text, NULL::text;
END
$$;

-- The batch functions (migration 0007), per bucket. The settle calls the head lock, so the
-- three go and come back together.
DROP FUNCTION outbox_settle(
    text[], bigint[], text[], bigint[], integer[], double precision[], text[], boolean[],
    timestamptz, text[], bigint[], timestamptz[], boolean[], boolean[], text[], text[],
    bigint[], boolean, text);
DROP FUNCTION outbox_claim(integer, integer, text[], timestamptz);
DROP FUNCTION outbox_lock_heads(text[]);

-- The append heads of `p_campaigns` (all in bucket `p_bucket`) held (FOR SHARE) until the
-- transaction ends, skipping any an append holds now. A campaign row may be deleted only
-- under this lock: an append that comes later waits for the batch to commit, then creates a
-- fresh campaign row; one in flight keeps the campaign row. A campaign with no head row
-- (journal rows written by another tool) has no append to wait for and counts as held.
CREATE FUNCTION outbox_lock_heads(p_bucket integer, p_campaigns text[])
RETURNS TABLE (campaign_id text)
LANGUAGE plpgsql VOLATILE
AS $$
#variable_conflict use_column
DECLARE
    held text[];
BEGIN
    SELECT coalesce(array_agg(x.campaign_id), '{}') INTO held
    FROM (
        SELECT h.campaign_id FROM campaign_heads h
        WHERE h.bucket = p_bucket AND h.campaign_id = ANY (p_campaigns)
        ORDER BY h.campaign_id
        FOR SHARE SKIP LOCKED
    ) x;
    RETURN QUERY
    SELECT t.campaign_id FROM unnest(held) AS t(campaign_id)
    UNION ALL
    SELECT t.campaign_id FROM unnest(p_campaigns) AS t(campaign_id)
    WHERE NOT t.campaign_id = ANY (held)
      AND NOT EXISTS (
          SELECT 1 FROM campaign_heads h
          WHERE h.bucket = p_bucket AND h.campaign_id = t.campaign_id
      );
END
$$;

-- The ordered claim in bucket `p_bucket` (as in 0007): lock up to p_campaigns due campaigns
-- that are not blocked, oldest due first, skipping campaigns other workers hold; then, in a
-- second statement whose snapshot sees each campaign as its previous holder left it, their
-- rows from the head (at most p_budget in all, shared among the campaigns, rounded up), first
-- and last outstanding seq, the ordered projectors' checkpoints locked in a fixed order, and
-- each row's event as text. A campaign with no rows left comes back as one row with a null
-- seq. p_now: tests move time with it; null is statement_timestamp().
CREATE FUNCTION outbox_claim(
    p_bucket integer,
    p_campaigns integer,
    p_budget integer,
    p_projectors text[],
    p_now timestamptz DEFAULT NULL
)
RETURNS TABLE (
    campaign_id text,
    due boolean,
    first_seq bigint,
    last_seq bigint,
    projectors text[],
    applied_seqs bigint[],
    seq bigint,
    status text,
    attempt_count integer,
    next_attempt_at timestamptz,
    lease_owner text,
    claim_epoch bigint,
    event_type text,
    payload text,
    metadata text,
    recorded_at timestamptz
)
LANGUAGE plpgsql VOLATILE
SET enable_seqscan = off
AS $$
#variable_conflict use_column
DECLARE
    ids text[];
    heads bigint[];
    v_now timestamptz := coalesce(p_now, statement_timestamp());
BEGIN
    SELECT array_agg(c.campaign_id ORDER BY c.campaign_id),
           array_agg(c.head_seq ORDER BY c.campaign_id)
    INTO ids, heads
    FROM (
        SELECT q.campaign_id, q.head_seq
        FROM projection_apply_campaigns q
        WHERE q.bucket = p_bucket AND NOT q.blocked AND q.due_at <= v_now
        ORDER BY q.due_at
        LIMIT p_campaigns
        FOR UPDATE SKIP LOCKED
    ) c;
    IF ids IS NULL THEN
        RETURN;
    END IF;
    RETURN QUERY
    WITH checkpoints AS (
        SELECT t.campaign_id, k.projector, k.applied_seq
        FROM unnest(ids) AS t(campaign_id)
        CROSS JOIN LATERAL (
            SELECT k.projector, k.applied_seq
            FROM projection_checkpoints k
            WHERE k.bucket = p_bucket AND k.campaign_id = t.campaign_id
              AND k.projector = ANY (p_projectors)
            ORDER BY k.projector
            FOR UPDATE
        ) k
    )
    SELECT p.campaign_id,
           o.status IN ('pending', 'failed', 'processing') AND o.next_attempt_at <= v_now,
           b.first_seq, b.last_seq, k.projectors, k.applied_seqs,
           o.seq, o.status, o.attempt_count, o.next_attempt_at, o.lease_owner, o.claim_epoch,
           j.event_type, j.payload::text, j.metadata::text, j.recorded_at
    FROM unnest(ids, heads) AS p(campaign_id, head_seq)
    CROSS JOIN LATERAL (
        SELECT min(x.seq) AS first_seq, max(x.seq) AS last_seq
        FROM projection_apply_outbox x
        WHERE x.bucket = p_bucket AND x.campaign_id = p.campaign_id
    ) b
    CROSS JOIN LATERAL (
        SELECT array_agg(c.projector) AS projectors, array_agg(c.applied_seq) AS applied_seqs
        FROM checkpoints c
        WHERE c.campaign_id = p.campaign_id
    ) k
    LEFT JOIN LATERAL (
        SELECT x.seq, x.status, x.attempt_count, x.next_attempt_at, x.lease_owner,
               x.claim_epoch
        FROM projection_apply_outbox x
        WHERE x.bucket = p_bucket AND x.campaign_id = p.campaign_id AND x.seq >= p.head_seq
        ORDER BY x.seq
        LIMIT (p_budget + cardinality(ids) - 1) / cardinality(ids)
    ) o ON true
    LEFT JOIN LATERAL (
        -- One index probe per row. OFFSET 0 keeps it a probe: a generic plan guesses the
        -- rows per campaign high and would join the whole journal by hash.
        SELECT e.event_type, e.payload, e.metadata, e.recorded_at
        FROM event_journal e
        WHERE e.bucket = p_bucket AND e.campaign_id = p.campaign_id AND e.seq = o.seq
        OFFSET 0
    ) j ON true
    ORDER BY p.campaign_id, o.seq;
END
$$;

-- The end of a batch in bucket `p_bucket`, in one call (as in 0007). The failures' next
-- attempts and every instant come from one clock reading (v_now) taken before the writes;
-- the NOTIFY is sent after them, by this session.
CREATE FUNCTION outbox_settle(
    p_bucket integer,
    d_campaigns text[], d_seqs bigint[],
    f_campaigns text[], f_seqs bigint[], f_attempts integer[], f_delays double precision[],
    f_errors text[], f_dead boolean[],
    p_now timestamptz,
    t_campaigns text[], t_heads bigint[], t_due timestamptz[], t_blocked boolean[],
    t_gone boolean[],
    k_campaigns text[], k_projectors text[], k_seqs bigint[],
    p_notify boolean, p_channel text,
    OUT due bigint, OUT ages double precision[]
)
LANGUAGE plpgsql VOLATILE
SET enable_seqscan = off
AS $$
#variable_conflict use_column
DECLARE
    held text[] := '{}';
    v_now timestamptz := coalesce(p_now, clock_timestamp());
    f_next timestamptz[];
BEGIN
    IF true = ANY (t_gone) THEN
        SELECT coalesce(array_agg(h.campaign_id), '{}') INTO held
        FROM outbox_lock_heads(p_bucket, ARRAY(
            SELECT t.c FROM unnest(t_campaigns, t_gone) AS t(c, g) WHERE t.g
        )) h;
    END IF;
    f_next := ARRAY(
        SELECT v_now + make_interval(secs => f.delay)
        FROM unnest(f_delays) WITH ORDINALITY AS f(delay, ord) ORDER BY f.ord
    );
    WITH done AS (
        DELETE FROM projection_apply_outbox o
        USING unnest(d_campaigns, d_seqs) AS d(campaign_id, seq)
        WHERE o.bucket = p_bucket AND o.campaign_id = d.campaign_id AND o.seq = d.seq
        RETURNING extract(epoch FROM v_now - o.enqueued_at)::double precision AS age
    ), failed AS (
        UPDATE projection_apply_outbox o
        SET status = CASE WHEN f.dead THEN 'dead' ELSE 'failed' END,
            attempt_count = f.attempts,
            next_attempt_at = f.next,
            last_error = f.error,
            updated_at = v_now
        FROM unnest(f_campaigns, f_seqs, f_attempts, f_next, f_errors, f_dead)
            AS f(campaign_id, seq, attempts, next, error, dead)
        WHERE o.bucket = p_bucket AND o.campaign_id = f.campaign_id AND o.seq = f.seq
        RETURNING o.campaign_id, o.seq, o.next_attempt_at
    ), moved AS (
        INSERT INTO projection_checkpoints AS k (bucket, campaign_id, projector, applied_seq,
                                                 updated_at)
        SELECT p_bucket, m.campaign_id, m.projector, m.applied_seq, v_now
        FROM unnest(k_campaigns, k_projectors, k_seqs) AS m(campaign_id, projector, applied_seq)
        ON CONFLICT (bucket, campaign_id, projector)
        DO UPDATE SET applied_seq = excluded.applied_seq, updated_at = v_now
    ), target AS (
        SELECT t.campaign_id, t.head_seq, t.due_at, t.blocked,
               t.gone AND t.campaign_id = ANY (held) AS gone
        FROM unnest(t_campaigns, t_heads, t_due, t_blocked, t_gone)
            AS t(campaign_id, head_seq, due_at, blocked, gone)
    ), beyond AS (
        -- Campaigns the batch saw to their end that have rows past what it saw after all: an
        -- append committed before the heads were held (this statement's snapshot shows it).
        SELECT t.campaign_id FROM target t
        WHERE t.gone AND EXISTS (
            SELECT 1 FROM projection_apply_outbox o
            WHERE o.bucket = p_bucket AND o.campaign_id = t.campaign_id AND o.seq >= t.head_seq
        )
    ), gone AS (
        DELETE FROM projection_apply_campaigns c
        USING target t
        WHERE c.bucket = p_bucket AND t.gone AND c.campaign_id = t.campaign_id
          AND t.campaign_id NOT IN (SELECT b.campaign_id FROM beyond b)
    ), kept AS (
        -- The batch holds these rows (its claim locked them): an update, no insert.
        UPDATE projection_apply_campaigns c
        SET head_seq = t.head_seq,
            due_at = coalesce(f.next_attempt_at, t.due_at, v_now),
            blocked = t.blocked,
            updated_at = v_now
        FROM target t
        LEFT JOIN failed f ON f.campaign_id = t.campaign_id AND f.seq = t.head_seq
        WHERE c.bucket = p_bucket AND c.campaign_id = t.campaign_id
          AND (NOT t.gone OR t.campaign_id IN (SELECT b.campaign_id FROM beyond b))
        RETURNING c.head_seq, c.due_at, c.blocked
    )
    SELECT (
        SELECT count(*) FROM kept
        WHERE kept.head_seq > 0 AND NOT kept.blocked AND kept.due_at <= v_now
    ),
    (SELECT array_agg(done.age) FROM done)
    INTO due, ages;
    IF p_notify AND ages IS NOT NULL THEN
        PERFORM pg_notify(p_channel, p_bucket::text);
    END IF;
END
$$;

-- Which buckets have work, and from when: per bucket, the earliest due time after p_after
-- ('-infinity': any) of an unblocked campaign row, or of a live work row with p_rows
-- (ordering `none`). One index probe per bucket (the claim indexes lead with the bucket), so
-- the cost is the number of buckets, not the queue; buckets with nothing return no row. What
-- a worker's claim loop moves over, refreshed at most once per poll interval.
CREATE FUNCTION outbox_due_buckets(p_rows boolean, p_after timestamptz)
RETURNS TABLE (bucket integer, due_at timestamptz)
LANGUAGE plpgsql STABLE
AS $$
#variable_conflict use_column
DECLARE
    b integer;
    at timestamptz;
BEGIN
    FOR b IN 0 .. outbox_bucket_count() - 1 LOOP
        IF p_rows THEN
            SELECT min(o.next_attempt_at) INTO at FROM projection_apply_outbox o
            WHERE o.bucket = b AND o.status IN ('pending', 'failed')
              AND o.next_attempt_at > p_after;
        ELSE
            SELECT min(c.due_at) INTO at FROM projection_apply_campaigns c
            WHERE c.bucket = b AND NOT c.blocked AND c.due_at > p_after;
        END IF;
        IF at IS NOT NULL THEN
            bucket := b;
            due_at := at;
            RETURN NEXT;
        END IF;
    END LOOP;
END
$$;
