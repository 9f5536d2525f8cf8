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

-- The end of a batch in bucket `p_bucket`, in one call. First statement: hold the append heads
-- of the campaigns the batch left with nothing live (t_gone; outbox_lock_heads). The failures'
-- next attempts and every instant come from one clock reading (v_now) taken before the writes.
-- Then the checkpoints of ordered projectors move (k_*, sorted: a fixed lock order): those the
-- claim found (and locked) by UPDATE ... FROM the arrays, the few not there yet (a campaign's
-- first batch under an ordered projector) by INSERT ... VALUES one by one: Citus routes both
-- to the batch's shard, where an INSERT ... SELECT from arrays would go through its COPY path
-- and commit by two-phase commit. Then one statement, whose snapshot sees every append that
-- committed before the heads were held: delete completed rows (d_*); record failures (f_*:
-- attempts, status failed or dead, the next attempt at now + delay, the error); write each
-- campaign's row (t_*): delete it when the batch left it nothing live, its head is held, and no
-- row at or past head_seq (the first seq the batch did not see) exists now; else set its head,
-- blocked flag and due time (the failure's next attempt when the head is a row this batch
-- failed, else t_due, else now). With p_notify and rows deleted, one NOTIFY on p_channel
-- (payload: the bucket; readers waiting for their writes look again), sent after the writes
-- by this session. Returns how many campaigns are left due now with a head to take (the
-- worker claims again instead of sleeping) and the seconds each deleted row waited since it
-- was enqueued. p_now: null is clock_timestamp().
CREATE OR REPLACE FUNCTION outbox_settle(
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
SET search_path FROM CURRENT
SET enable_seqscan = off
AS $$
#variable_conflict use_column
DECLARE
    held text[] := '{}';
    v_now timestamptz := coalesce(p_now, clock_timestamp());
    f_next timestamptz[];
    moved bigint[];
    i integer;
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
    IF cardinality(k_campaigns) > 0 THEN
        -- Checkpoints the claim found (and locked) move in place; the array says which, by
        -- their position in k_*.
        WITH m AS (
            UPDATE projection_checkpoints k
            SET applied_seq = m.applied_seq, updated_at = v_now
            FROM unnest(k_campaigns, k_projectors, k_seqs) WITH ORDINALITY
                AS m(campaign_id, projector, applied_seq, ord)
            WHERE k.bucket = p_bucket AND k.campaign_id = m.campaign_id
              AND k.projector = m.projector
            RETURNING m.ord
        )
        SELECT coalesce(array_agg(m.ord), '{}') INTO moved FROM m;
        FOR i IN 1 .. cardinality(k_campaigns) LOOP
            CONTINUE WHEN i = ANY (moved);
            INSERT INTO projection_checkpoints AS k (bucket, campaign_id, projector, applied_seq,
                                                     updated_at)
            VALUES (p_bucket, k_campaigns[i], k_projectors[i], k_seqs[i], v_now)
            ON CONFLICT (bucket, campaign_id, projector)
            DO UPDATE SET applied_seq = excluded.applied_seq, updated_at = excluded.updated_at;
        END LOOP;
    END IF;
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
