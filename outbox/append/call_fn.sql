-- The append as SQL functions, so every client appends in its own transaction with one call:
-- Python (asyncpg, SQLAlchemy, psycopg, Django; `call.py`), another language (Go, Node), a
-- psql script. Called schema-qualified (`outbox.outbox_append(...)`): the caller's search_path
-- need not name the outbox's schema, and each function pins its own.
--
--   outbox_append(campaign_id, events, expected_seq, idempotency_key)
--       -> (first_seq, last_seq, duplicate); a refusal is an error with its own SQLSTATE:
--          OB001 invalid input (DETAIL: the field), OB002 expected_seq is not the head (DETAIL:
--          the head), OB003 the idempotency key was used for other events (DETAIL: the first
--          append's first_seq..last_seq). Nothing is written by a refused call.
--   outbox_try_append(...) the same append, the refusal returned as a row instead of raised,
--          so a caller inside its own transaction goes on after it (the Python API uses it).
--
-- `events` is a JSON array of {"type": string, "payload": any JSON (null included; the key is
-- required), "metadata": object or null (optional), "version": the payload's schema version,
-- an integer from 1 (optional, default 1)}. These functions are the authority on
-- what an append accepts, for every language: Python checks first only what cannot reach
-- them as it is (docs/append.md, "Validation"). Enqueueing and the key TTL come from the
-- arguments, else the settings `outbox.enqueue` (default on) and `outbox.append_key_ttl`
-- (seconds, default 86400), which a deployment sets with ALTER DATABASE/ROLE ... SET.
--
-- Each statement names the campaign's bucket and takes its instant from one clock reading;
-- an append of up to 4 events writes its rows one by one by INSERT ... VALUES, which Citus
-- routes to the campaign's shard (a plain COMMIT on a cluster), and a longer one set-wise, one
-- statement per table (on Citus, COPY and two-phase commit). Measured one writer at a time
-- against the set-wise form: on a durable three-node cluster 2 events 2.02x the appends/s, 4
-- events 1.57x, 16 events 0.70x; on plain PostgreSQL with fsync off 1.08x, 0.84x and 0.55x
-- (docs/performance.md). The campaign's queue row is created only when it has none, and the
-- NOTIFY that wakes the workers (channel `<schema>.outbox_work`, payload the bucket) is sent
-- only then.
-- requires: buckets/distribution_fn.sql

-- What a keyed append appended: [[type, payload, metadata], ...] as stored, an event of a
-- version other than 1 with it as a fourth item (so a key taken before versions existed
-- matches its retry), (jsonb renders objects with their keys in one order, so the key order a
-- client sent does not matter). A
-- SQL-standard body: its names are bound when it is created, whatever the caller's path.
CREATE OR REPLACE FUNCTION outbox_fingerprint(events jsonb) RETURNS bytea
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
RETURN sha256(convert_to(events::text, 'UTF8'));

-- A journal insert that found its seq taken, under READ COMMITTED: a row written without the
-- head's lock (by a tool, by hand). The journal keeps what it has and the append fails, as a
-- plain insert's unique violation would. (Under REPEATABLE READ the insert's ON CONFLICT
-- raises 40001 first: an append committed since the transaction's snapshot took the seq.)
CREATE OR REPLACE FUNCTION outbox_seq_taken(p_campaign_id text, p_seq bigint) RETURNS void
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    RAISE EXCEPTION USING ERRCODE = 'unique_violation', CONSTRAINT = 'event_journal_pkey',
        MESSAGE = format('campaign %L: seq %s is in the journal already, written without the '
                         'campaign head''s lock', p_campaign_id, p_seq);
END
$$;

-- What the projectors of worker groups other than the default one (S35) are owed by an append
-- of `p_events` (the append's stored form: [type, payload, metadata, ...]) to campaign
-- `p_campaign_id` (bucket `p_bucket`) from seq `p_first`: each such projector subscribed to an
-- appended type gets its hold, its group's queue, on the campaign where it has none (seq 0,
-- `from_seq` the first event it owes), and its group's workers are woken (the payload names
-- the group). The append calls it holding the campaign's head, so two appends never both
-- write one, and a group's batch releases one only under the head (`outbox_settle`). In an
-- install without groups, one probe of an empty index range. SECURITY DEFINER (its path
-- pinned): an appender's role reads no projector record and writes no hold
-- (docs/operations.md), and it does nothing a caller could choose but for whom.
CREATE OR REPLACE FUNCTION outbox_owe_groups(
    p_bucket integer,
    p_campaign_id text,
    p_first bigint,
    p_events jsonb
) RETURNS void
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER
SET search_path FROM CURRENT
SET enable_seqscan = off
SET plan_cache_mode = force_generic_plan
SET jit = off
AS $$
DECLARE
    v_group text;
    v_now timestamptz := clock_timestamp();
BEGIN
    IF NOT EXISTS (SELECT 1 FROM outbox_projectors g WHERE g.group_name <> 'default') THEN
        RETURN;
    END IF;
    FOR v_group IN
        WITH owed AS (
            INSERT INTO projection_holds AS h (bucket, campaign_id, projector, seq, status,
                                               next_attempt_at, created_at, updated_at,
                                               from_seq)
            SELECT p_bucket, p_campaign_id, g.projector, 0, 'pending', v_now, v_now, v_now,
                   p_first
            FROM outbox_projectors g
            WHERE g.group_name <> 'default'
              AND g.events && ARRAY(SELECT e.value ->> 0
                                    FROM jsonb_array_elements(p_events) AS e(value))
              AND NOT EXISTS (  -- a version promoted past is owed nothing (S29)
                  SELECT 1 FROM outbox_projector_live l
                  WHERE l.projector = g.base AND l.version > g.version)
              AND NOT EXISTS (
                  SELECT 1 FROM projection_holds x
                  WHERE x.bucket = p_bucket AND x.campaign_id = p_campaign_id
                    AND x.projector = g.projector)
            ORDER BY g.projector
            ON CONFLICT DO NOTHING
            RETURNING h.projector
        )
        SELECT DISTINCT g.group_name
        FROM outbox_projectors g
        WHERE g.projector IN (SELECT o.projector FROM owed o)
    LOOP
        PERFORM pg_notify(current_schema() || '.outbox_group', v_group);
    END LOOP;
END
$$;

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
LANGUAGE plpgsql
SET search_path FROM CURRENT
-- Every statement here reads or writes by a key (a campaign, its bucket): a plan made once per
-- session and kept (generic), an index probe whatever the statistics say, also on tables
-- analyzed while empty. With the default plan choice each call planned most of its
-- statements again (their custom plans looked cheaper than the generic one): 2.0-2.7x the
-- server time of an append (docs/performance.md, "Appending").
SET enable_seqscan = off
SET plan_cache_mode = force_generic_plan
SET jit = off
AS $$
#variable_conflict use_column
DECLARE
    n integer;
    b integer;
    v_now timestamptz := clock_timestamp();
    -- The slot of the rows written now, once: outbox_queue_slot is a SQL function that no
    -- planner inlines, so a statement would call it again for each row it writes.
    v_slot smallint := outbox_queue_slot(v_now);
    bad text[];  -- {field, message} of the first rule broken
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
    held boolean := false;
    head_floor bigint;
    written bigint;
    earliest bigint;
    i integer;
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
        -- The first broken rule, in the events' order, then the events as they are stored
        -- (the key travels in each event's metadata). Arrays by ARRAY(...), not aggregates: a
        -- statement with an aggregate sets one up on every call, which was a seventh of the
        -- append's time (perf).
        bad := (
            SELECT ARRAY[format('events[%s]%s', e.ord - 1, e.broken[1]), e.broken[2]]
            FROM (
                SELECT ord, CASE
                    WHEN jsonb_typeof(value) <> 'object' THEN ARRAY['',
                        'expected an object with type, payload and optional metadata and version']
                    WHEN value - ARRAY['type', 'payload', 'metadata', 'version'] <> '{}'::jsonb
                        THEN ARRAY['', 'expected only type, payload, metadata and version']
                    WHEN jsonb_typeof(value -> 'type') IS DISTINCT FROM 'string'
                        THEN ARRAY['.type', 'expected a string']
                    WHEN btrim(value ->> 'type') = '' THEN ARRAY['.type', 'must not be empty']
                    WHEN length(value ->> 'type') > 256 THEN ARRAY['.type',
                        format('must be at most 256 characters, got %s', length(value ->> 'type'))]
                    WHEN NOT value ? 'payload'
                        THEN ARRAY['.payload', 'is required (null is allowed)']
                    WHEN jsonb_typeof(value -> 'metadata') NOT IN ('object', 'null')
                        THEN ARRAY['.metadata', 'expected an object or null']
                    WHEN value ? 'version' AND (jsonb_typeof(value -> 'version') <> 'number'
                         OR (value ->> 'version')::numeric NOT BETWEEN 1 AND 2147483647
                         OR (value ->> 'version')::numeric % 1 <> 0)
                        THEN ARRAY['.version', format('expected an integer from 1, got %s',
                                                      value -> 'version')]
                    WHEN p_idempotency_key IS NOT NULL
                      AND value -> 'metadata' ? 'idempotency_key'
                      AND value -> 'metadata' -> 'idempotency_key' <> to_jsonb(p_idempotency_key)
                        THEN ARRAY['.metadata', '"idempotency_key" is set by the append from its '
                                                'idempotency_key; got a different value']
                    WHEN octet_length((value -> 'payload')::text) > 1048576 THEN ARRAY['.payload',
                        format('encodes to %s bytes, more than 1048576',
                               octet_length((value -> 'payload')::text))]
                END AS broken
                FROM jsonb_array_elements(p_events) WITH ORDINALITY AS e(value, ord)
            ) e
            WHERE e.broken IS NOT NULL
            ORDER BY e.ord
            LIMIT 1);
        IF bad IS NULL THEN
            appended := to_jsonb(ARRAY(
                SELECT jsonb_build_array(
                           value ->> 'type',
                           value -> 'payload',
                           coalesce(nullif(value -> 'metadata', 'null'::jsonb), '{}'::jsonb)
                               || CASE WHEN p_idempotency_key IS NULL THEN '{}'::jsonb
                                       ELSE jsonb_build_object('idempotency_key', p_idempotency_key)
                                  END)
                       || CASE WHEN coalesce(value -> 'version', '1') <> '1'
                               THEN jsonb_build_array(value -> 'version') ELSE '[]' END
                FROM jsonb_array_elements(p_events) WITH ORDINALITY AS e(value, ord)
                ORDER BY ord));
        END IF;
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
            IF known_fp IS NOT NULL AND known_fp <> fp THEN  -- keys from 0.1.0 have none
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

    -- Seqs from the campaign head, which the append holds until commit (gap-free), by a row
    -- lock alone (S28): a campaign's first append makes the head's key row, every later one
    -- locks it, and neither writes a version a held snapshot would keep. The head itself is
    -- the journal's last seq, read in a statement after the lock, whose snapshot sees the
    -- append the lock waited for (READ COMMITTED). Under REPEATABLE READ or SERIALIZABLE the
    -- read is the transaction's snapshot: an append committed since then makes this one's
    -- journal insert a serialization failure (40001, ON CONFLICT below), as before.
    LOOP
        SELECT h.last_seq INTO head_floor FROM campaign_head_keys h
        WHERE h.bucket = b AND h.campaign_id = p_campaign_id
        FOR NO KEY UPDATE;
        held := FOUND;
        EXIT WHEN held OR p_expected_seq > 0;  -- no head and one expected: refused below
        -- A new campaign. Of two first appends, the one that waited for the other's commit
        -- inserts nothing, and goes round again to lock the key the other made.
        INSERT INTO campaign_head_keys AS h (bucket, campaign_id, last_seq, updated_at)
        VALUES (b, p_campaign_id, n, v_now)
        ON CONFLICT (bucket, campaign_id) DO NOTHING;
        IF FOUND THEN
            head := n;
            EXIT;
        END IF;
    END LOOP;
    IF held AND p_expected_seq IS DISTINCT FROM 0 THEN
        -- The key's floor came with its lock (it never changes); the journal's end is read
        -- in this statement of its own.
        SELECT greatest(head_floor, max(e.seq)) INTO head
        FROM event_journal e
        WHERE e.bucket = b AND e.campaign_id = p_campaign_id;
        head := CASE WHEN p_expected_seq IS NULL OR head = p_expected_seq THEN head + n END;
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

    IF n <= 4 THEN  -- row by row by VALUES, which Citus routes to the shard (a plain COMMIT)
        FOR i IN 1 .. n LOOP
            INSERT INTO event_journal (bucket, campaign_id, seq, event_type, payload, metadata,
                                       recorded_at, version)
            VALUES (b, p_campaign_id, head - n + i, appended -> (i - 1) ->> 0,
                    appended -> (i - 1) -> 1, appended -> (i - 1) -> 2, v_now,
                    coalesce((appended -> (i - 1) ->> 3)::numeric::integer, 1))
            ON CONFLICT DO NOTHING;
            GET DIAGNOSTICS written = ROW_COUNT;
            IF written < 1 THEN
                PERFORM outbox_seq_taken(p_campaign_id, head - n + i);
            END IF;
            IF enqueue THEN
                INSERT INTO projection_apply_outbox (bucket, campaign_id, seq, event_type,
                                                     next_attempt_at, enqueued_at, updated_at,
                                                     slot)
                VALUES (b, p_campaign_id, head - n + i, appended -> (i - 1) ->> 0, v_now, v_now,
                        v_now, v_slot);
            END IF;
        END LOOP;
    ELSE  -- set-wise: one statement per table (on Citus, COPY and two-phase commit)
        INSERT INTO event_journal (bucket, campaign_id, seq, event_type, payload, metadata,
                                   recorded_at, version)
        SELECT b, p_campaign_id, head - n + e.ord, e.value ->> 0, e.value -> 1, e.value -> 2,
               v_now, coalesce((e.value ->> 3)::numeric::integer, 1)
        FROM jsonb_array_elements(appended) WITH ORDINALITY AS e(value, ord)
        ON CONFLICT DO NOTHING;
        GET DIAGNOSTICS written = ROW_COUNT;
        IF written < n THEN
            PERFORM outbox_seq_taken(p_campaign_id, head - n + 1);
        END IF;
        IF enqueue THEN
            INSERT INTO projection_apply_outbox (bucket, campaign_id, seq, event_type,
                                                 next_attempt_at, enqueued_at, updated_at, slot)
            SELECT b, p_campaign_id, head - n + e.ord, e.value ->> 0, v_now, v_now, v_now,
                   v_slot
            FROM jsonb_array_elements(appended) WITH ORDINALITY AS e(value, ord);
        END IF;
    END IF;

    IF enqueue THEN
        -- The campaign's queue row, unless it has one in some slot (S26: the append holds
        -- the head, under which alone a campaign row is created; the look waits for no
        -- worker). A new one goes to the current period's slot and starts at the campaign's
        -- first row: rows from before (dead rows stepped over, rows a tool inserted) come
        -- first (an index probe: sequential scans are off in this function).
        PERFORM FROM projection_apply_campaigns c
        WHERE c.bucket = b AND c.campaign_id = p_campaign_id;
        IF NOT FOUND THEN
            INSERT INTO projection_apply_campaigns (bucket, campaign_id, head_seq, due_at,
                                                    updated_at, slot)
            VALUES (b, p_campaign_id, head - n + 1, v_now, v_now, v_slot);
            SELECT min(o.seq) INTO earliest FROM projection_apply_outbox o
            WHERE o.bucket = b AND o.campaign_id = p_campaign_id AND o.seq < head - n + 1;
            IF earliest IS NOT NULL THEN
                UPDATE projection_apply_campaigns c SET head_seq = earliest
                WHERE c.bucket = b AND c.campaign_id = p_campaign_id;
            END IF;
            -- A campaign the workers did not know has work: wake this install's workers,
            -- naming its bucket (at most once per append).
            PERFORM pg_notify(current_schema() || '.outbox_work', b::text);
        ELSE
            -- A campaign row left waiting for a projector's hold (a backoff, S24), or for
            -- holds alone (head_seq 0: a projector catching up, S25, a hold's retry), now has
            -- live work: due now, its head at the new rows (a batch that serves appends
            -- first takes it), and the workers woken for it as for a new campaign row. The
            -- campaign's other projectors apply the new rows at once. A row due already with
            -- rows of its own is not touched (and not waited for: the batch that holds it
            -- sees the new rows, `outbox_settle`); a batch that holds one of these keeps it
            -- (the append holds the head) and the update waits for its commit.
            UPDATE projection_apply_campaigns c
            SET due_at = least(c.due_at, v_now),
                head_seq = CASE WHEN c.head_seq = 0 THEN head - n + 1 ELSE c.head_seq END,
                updated_at = v_now
            WHERE c.bucket = b AND c.campaign_id = p_campaign_id
              AND (c.due_at > v_now OR c.head_seq = 0);
            IF FOUND THEN
                PERFORM pg_notify(current_schema() || '.outbox_work', b::text);
            END IF;
        END IF;
    END IF;

    IF enqueue THEN  -- what the worker groups' projectors are owed (S35)
        PERFORM outbox_owe_groups(b, p_campaign_id, head - n + 1, appended);
    END IF;

    IF p_idempotency_key IS NOT NULL THEN
        UPDATE append_idempotency_keys k
        SET first_seq = head - n + 1, last_seq = head
        WHERE k.bucket = b AND k.campaign_id = p_campaign_id AND k.idem_key = p_idempotency_key;
    END IF;
    RETURN QUERY SELECT head - n + 1, head, false, NULL::text, NULL::text, NULL::text;
END
$$;

CREATE OR REPLACE FUNCTION outbox_append(
    campaign_id text,
    events jsonb,
    expected_seq bigint DEFAULT NULL,
    idempotency_key text DEFAULT NULL
) RETURNS TABLE (first_seq bigint, last_seq bigint, duplicate boolean)
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
#variable_conflict use_column
DECLARE
    r record;
BEGIN
    SELECT * INTO r FROM outbox_try_append($1, $2, $3, $4);
    IF r.refusal = 'invalid' THEN
        RAISE EXCEPTION USING ERRCODE = 'OB001', MESSAGE = r.field || ': ' || r.message,
            DETAIL = r.field;
    ELSIF r.refusal = 'expected_seq' THEN
        RAISE EXCEPTION USING ERRCODE = 'OB002', MESSAGE = r.message, DETAIL = r.last_seq::text;
    ELSIF r.refusal = 'key_conflict' THEN
        RAISE EXCEPTION USING ERRCODE = 'OB003', MESSAGE = r.message,
            DETAIL = r.first_seq || '..' || r.last_seq;
    END IF;
    RETURN QUERY SELECT r.first_seq, r.last_seq, r.duplicate;
END
$$;

COMMENT ON FUNCTION outbox_append(text, jsonb, bigint, text) IS
    'Append events to a campaign and enqueue their work rows, in the caller''s transaction. '
    'SQLSTATE OB001 invalid input, OB002 expected_seq mismatch, OB003 idempotency key reused '
    'for other events.';

-- Back to the default plans on Citus (buckets/distribution_fn.sql).
SELECT outbox_plans_for_citus();
