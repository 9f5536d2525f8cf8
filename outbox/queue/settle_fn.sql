-- The settle's server functions (`settle.py`): the end of a batch in one call, and the
-- statement clock that the queue's writes call.
-- requires: queue/claim_fn.sql

-- The statement clock for writes that take an optional instant: `outbox_now(p)` is `p`, or the
-- statement's timestamp when `p` is null (the worker passes null; tests pass an instant). A
-- statement that writes a distributed table on Citus may call a stable function only with
-- constants and parameters (Citus evaluates it on the coordinator and routes the result), and
-- no function at all inside COALESCE or CASE; `coalesce($n, statement_timestamp())` breaks the
-- second rule, `outbox_now($n)` keeps both. PL/pgSQL, so that no planner inlines it back into a
-- COALESCE. On plain PostgreSQL it is the same instant.
CREATE OR REPLACE FUNCTION outbox_now(p_at timestamptz) RETURNS timestamptz
LANGUAGE plpgsql STABLE PARALLEL SAFE
SET search_path FROM CURRENT
AS $$
BEGIN
    RETURN coalesce(p_at, statement_timestamp());
END
$$;

-- The end of a batch in bucket `p_bucket`, in one call, its work in one JSON document
-- (`p_batch`), so that a field added later is a key old callers leave out, not another copy of
-- the function:
--   done         [{campaign_id, seq}]                            completed rows, deleted
--   failed       [{campaign_id, seq, attempts, delay, error, dead}] failures as the policy
--                                                                  decided them
--   campaigns    [{campaign_id, head_seq, due_at, blocked, gone}]  each held campaign's row
--   checkpoints  [{campaign_id, projector, applied_seq}]            moves, sorted (lock order)
--   now          an instant (tests), or null: clock_timestamp(), read once before the writes
--   notify       with rows deleted, one NOTIFY on `channel` (payload: the bucket)
-- Citus routes the writes below to the batch's shard, reading their rows from the document
-- (`jsonb_to_recordset`), and refuses in them a stable expression over those rows: the
-- failures' next attempts (`now + delay`) are worked out first, into the document, by a
-- statement of the coordinator's own. Measured against the 20 positional arrays it replaces
-- (one warm connection, calls rolled back), the call costs the same or less.
-- First statement: hold the append heads of the campaigns the batch left with nothing live
-- (`gone`; outbox_lock_heads). Then the checkpoints move: those the claim found (and locked)
-- by UPDATE ... FROM the document, the few not there yet (a campaign's first batch under an
-- ordered projector) by INSERT ... VALUES one by one: Citus routes both to the batch's shard,
-- where an INSERT ... SELECT would go through its COPY path and commit by two-phase commit.
-- Then one statement, whose snapshot sees every append that committed before the heads were
-- held: delete completed rows; record failures (attempts, status failed or dead, the next
-- attempt at now + delay, the error); write each campaign's row: delete it when the batch left
-- it nothing live, its head is held, and no row at or past head_seq (the first seq the batch
-- did not see) exists now; else set its head, blocked flag and due time (the failure's next
-- attempt when the head is a row this batch failed, else due_at, else now). The NOTIFY goes
-- after the writes, from this session (readers waiting for their writes look again). Returns
-- how many campaigns are left due now with a head to take (the worker claims again instead of
-- sleeping) and the seconds each deleted row waited since it was enqueued.
CREATE OR REPLACE FUNCTION outbox_settle(
    p_bucket integer,
    p_batch jsonb,
    OUT due bigint, OUT ages double precision[]
)
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
SET enable_seqscan = off
AS $$
#variable_conflict use_column
DECLARE
    held text[] := '{}';
    v_now timestamptz := coalesce((p_batch ->> 'now')::timestamptz, clock_timestamp());
    gone text[];
    failed jsonb := '[]';
    moved bigint[];
    m record;
BEGIN
    gone := ARRAY(
        SELECT t.campaign_id
        FROM jsonb_to_recordset(p_batch -> 'campaigns') AS t(campaign_id text, gone boolean)
        WHERE t.gone
    );
    IF cardinality(gone) > 0 THEN
        SELECT coalesce(array_agg(h.campaign_id), '{}') INTO held
        FROM outbox_lock_heads(p_bucket, gone) h;
    END IF;
    IF jsonb_array_length(p_batch -> 'failed') > 0 THEN
        SELECT jsonb_agg(f.value || jsonb_build_object(
                   'next', v_now + make_interval(secs => (f.value ->> 'delay')::double precision))
                   ORDER BY f.ord)
        INTO failed
        FROM jsonb_array_elements(p_batch -> 'failed') WITH ORDINALITY AS f(value, ord);
    END IF;
    IF jsonb_array_length(p_batch -> 'checkpoints') > 0 THEN
        -- Checkpoints the claim found (and locked) move in place; the array says which, by
        -- their position in the document.
        WITH m AS (
            UPDATE projection_checkpoints k
            SET applied_seq = m.applied_seq, updated_at = v_now
            FROM ROWS FROM (
                jsonb_to_recordset(p_batch -> 'checkpoints')
                    AS (campaign_id text, projector text, applied_seq bigint)
            ) WITH ORDINALITY AS m(campaign_id, projector, applied_seq, ord)
            WHERE k.bucket = p_bucket AND k.campaign_id = m.campaign_id
              AND k.projector = m.projector
            RETURNING m.ord
        )
        SELECT coalesce(array_agg(m.ord), '{}') INTO moved FROM m;
        FOR m IN
            SELECT x.campaign_id, x.projector, x.applied_seq
            FROM ROWS FROM (
                jsonb_to_recordset(p_batch -> 'checkpoints')
                    AS (campaign_id text, projector text, applied_seq bigint)
            ) WITH ORDINALITY AS x(campaign_id, projector, applied_seq, ord)
            WHERE NOT x.ord = ANY (moved)
            ORDER BY x.ord
        LOOP
            INSERT INTO projection_checkpoints AS k (bucket, campaign_id, projector, applied_seq,
                                                     updated_at)
            VALUES (p_bucket, m.campaign_id, m.projector, m.applied_seq, v_now)
            ON CONFLICT (bucket, campaign_id, projector)
            DO UPDATE SET applied_seq = excluded.applied_seq, updated_at = excluded.updated_at;
        END LOOP;
    END IF;
    WITH done AS (
        DELETE FROM projection_apply_outbox o
        USING jsonb_to_recordset(p_batch -> 'done') AS d(campaign_id text, seq bigint)
        WHERE o.bucket = p_bucket AND o.campaign_id = d.campaign_id AND o.seq = d.seq
        RETURNING extract(epoch FROM v_now - o.enqueued_at)::double precision AS age
    ), failed AS (
        UPDATE projection_apply_outbox o
        SET status = CASE WHEN f.dead THEN 'dead' ELSE 'failed' END,
            attempt_count = f.attempts,
            next_attempt_at = f.next,
            last_error = f.error,
            updated_at = v_now
        FROM jsonb_to_recordset(failed)
            AS f(campaign_id text, seq bigint, attempts integer, next timestamptz, error text,
                 dead boolean)
        WHERE o.bucket = p_bucket AND o.campaign_id = f.campaign_id AND o.seq = f.seq
        RETURNING o.campaign_id, o.seq, o.next_attempt_at
    ), target AS (
        SELECT t.campaign_id, t.head_seq, t.due_at, t.blocked,
               t.gone AND t.campaign_id = ANY (held) AS gone
        FROM jsonb_to_recordset(p_batch -> 'campaigns')
            AS t(campaign_id text, head_seq bigint, due_at timestamptz, blocked boolean,
                 gone boolean)
    ), beyond AS (
        -- Campaigns the batch saw to their end that have rows past what it saw after all: an
        -- append committed before the heads were held (this statement's snapshot shows it).
        SELECT t.campaign_id FROM target t
        WHERE t.gone AND EXISTS (
            SELECT 1 FROM projection_apply_outbox o
            WHERE o.bucket = p_bucket AND o.campaign_id = t.campaign_id AND o.seq >= t.head_seq
        )
    ), removed AS (
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
    IF (p_batch ->> 'notify')::boolean AND ages IS NOT NULL THEN
        PERFORM pg_notify(p_batch ->> 'channel', p_bucket::text);
    END IF;
END
$$;
