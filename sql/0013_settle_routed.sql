-- The end of a batch (0009's outbox_settle) in statements Citus routes to the batch's shard,
-- so that a batch whose projector writes stay on that shard commits plainly (one COMMIT), not
-- by two-phase commit.
--
-- 0009 wrote everything in one statement whose data-modifying CTEs included the checkpoint
-- upsert, an INSERT ... SELECT from arrays. Citus cannot route that INSERT: it runs it through
-- the coordinator's COPY path, which always commits by two-phase commit, and, the statement
-- being no longer routable as a whole, splits the other CTEs into steps over intermediate
-- results (about 15 remote commands per settle). Now:
--   * the checkpoints move by UPDATE ... FROM unnest (routed); the few that do not exist yet
--     (a campaign's first batch under an ordered projector) are inserted one by one with
--     INSERT ... VALUES, which Citus routes too;
--   * the rest stays one statement, which Citus now routes whole (one remote command).
-- On plain PostgreSQL it is the same work in one statement more; the results are the same.
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
