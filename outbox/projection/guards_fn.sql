-- The checkpoints' server functions (`guards.py`; the claim and the settle call them too):
-- an ordered projector's checkpoint is locked through its key and moved by inserting (S27).
-- requires: buckets/distribution_fn.sql
--
-- A checkpoint is a key row (`projection_checkpoint_keys`: made once, never updated) and its
-- moves (`projection_checkpoint_moves`, in the queue's slots: one row per move, numbered per
-- key); its value is the newest move's, or the key's own when it has none. Whoever applies a
-- campaign under an ordered projector locks the key first (a row lock writes no version, so a
-- snapshot held elsewhere leaves nothing behind), then reads the value, then moves it, in one
-- transaction: the moves of a key are made one transaction at a time, in the order of their
-- numbers. A probe of a key reads its newest entry in each slot and nothing else: no version
-- of a checkpoint is ever dead until its slot is truncated.

-- The current checkpoints of `p_projectors` (null: every projector) in `p_campaigns` (all in bucket
-- `p_bucket`; -1: each in its own, `outbox_bucket_in`), unlocked: a probe of each key's newest
-- move. A missing key means 0.
CREATE OR REPLACE FUNCTION outbox_checkpoints_of(
    p_bucket integer,
    p_campaigns text[],
    p_projectors text[] DEFAULT NULL
)
RETURNS TABLE (campaign_id text, projector text, applied_seq bigint)
LANGUAGE plpgsql STABLE
SET search_path FROM CURRENT
SET enable_seqscan = off
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    SELECT k.campaign_id, k.projector, coalesce(m.applied_seq, k.applied_seq)
    FROM (SELECT DISTINCT u.c FROM unnest(p_campaigns) AS u(c)) AS t(campaign_id)
    JOIN projection_checkpoint_keys k
        ON k.bucket = outbox_bucket_in(p_bucket, t.campaign_id) AND k.campaign_id = t.campaign_id
    LEFT JOIN LATERAL (
        SELECT m.applied_seq
        FROM projection_checkpoint_moves m
        WHERE m.bucket = outbox_bucket_in(p_bucket, t.campaign_id)
          AND m.campaign_id = k.campaign_id AND m.projector = k.projector
        ORDER BY m.n DESC
        LIMIT 1
    ) m ON true
    WHERE p_projectors IS NULL OR k.projector = ANY (p_projectors)
    ORDER BY k.campaign_id, k.projector;
END
$$;

-- Refuse to lock checkpoints outside READ COMMITTED: a lock that waited is followed by a read
-- of the value in a statement of its own, whose snapshot sees the move the lock waited for;
-- under REPEATABLE READ that read would be stale (S27).
CREATE OR REPLACE FUNCTION outbox_require_read_committed()
RETURNS void
LANGUAGE plpgsql STABLE
SET search_path FROM CURRENT
AS $$
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'outbox: checkpoints are locked in READ COMMITTED transactions only, '
                        'not %', current_setting('transaction_isolation')
            USING ERRCODE = 'feature_not_supported';
    END IF;
END
$$;

-- The checkpoints `outbox_checkpoints_of` reads, locked FOR UPDATE in a fixed order (campaign,
-- projector) until the transaction ends; a missing key is not locked and means 0 (its caller
-- holds the campaign, or creates the keys first). Two statements: the read after the lock has
-- a snapshot of its own (READ COMMITTED), which sees every move committed by a transaction the
-- lock waited for. Under REPEATABLE READ a lock that waited would be followed by a read of the
-- old snapshot, so the function refuses to run in one.
CREATE OR REPLACE FUNCTION outbox_lock_checkpoints(
    p_bucket integer,
    p_campaigns text[],
    p_projectors text[]
)
RETURNS TABLE (campaign_id text, projector text, applied_seq bigint)
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
SET enable_seqscan = off
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
BEGIN
    PERFORM outbox_require_read_committed();
    PERFORM 1
    FROM (SELECT DISTINCT u.c FROM unnest(p_campaigns) AS u(c) ORDER BY u.c) AS t(campaign_id)
    CROSS JOIN LATERAL (
        SELECT 1
        FROM projection_checkpoint_keys k
        WHERE k.bucket = outbox_bucket_in(p_bucket, t.campaign_id)
          AND k.campaign_id = t.campaign_id AND k.projector = ANY (p_projectors)
        ORDER BY k.projector
        FOR UPDATE
    ) k;
    RETURN QUERY SELECT * FROM outbox_checkpoints_of(p_bucket, p_campaigns, p_projectors);
END
$$;

-- Move the checkpoint of (`p_campaign_id`, `p_projector`) in bucket `p_bucket` to
-- `p_applied_seq`, by its caller, who locked its key (or makes it now: a campaign's first
-- batch under the projector, whose claim found no key to lock). A new key takes the value
-- itself; a key that exists gets a move numbered one past its newest, in the slot of
-- `p_now`. Statements that name the whole key, and values rather than a SELECT, so that
-- Citus routes each to its shard.
CREATE OR REPLACE FUNCTION outbox_move_checkpoint(
    p_bucket integer,
    p_campaign_id text,
    p_projector text,
    p_applied_seq bigint,
    p_now timestamptz
)
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
SET enable_seqscan = off
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    v_n bigint;
BEGIN
    SELECT m.n INTO v_n
    FROM projection_checkpoint_moves m
    WHERE m.bucket = p_bucket AND m.campaign_id = p_campaign_id AND m.projector = p_projector
    ORDER BY m.n DESC
    LIMIT 1;
    IF v_n IS NULL THEN
        PERFORM 1 FROM projection_checkpoint_keys k
        WHERE k.bucket = p_bucket AND k.campaign_id = p_campaign_id AND k.projector = p_projector;
        IF NOT FOUND THEN
            INSERT INTO projection_checkpoint_keys AS k (bucket, campaign_id, projector,
                                                         applied_seq, updated_at)
            VALUES (p_bucket, p_campaign_id, p_projector, p_applied_seq, p_now)
            ON CONFLICT (bucket, campaign_id, projector) DO NOTHING;
            IF FOUND THEN
                RETURN;
            END IF;
        END IF;
    END IF;
    INSERT INTO projection_checkpoint_moves (bucket, campaign_id, projector, n, applied_seq,
                                             moved_at, slot)
    VALUES (p_bucket, p_campaign_id, p_projector, coalesce(v_n, 0) + 1, p_applied_seq, p_now,
            outbox_queue_slot(p_now));
END
$$;

-- Move the checkpoints of `p_moves` ([{campaign_id, projector, applied_seq}], sorted: lock order)
-- in bucket `p_bucket` (-1: each in its own; only on one server), as outbox_move_checkpoint moves
-- each, for a caller that locked their keys. On one server, in one statement: each key probed by
-- its whole key (a LATERAL with LIMIT 1 is an index probe per move however the tables were
-- analyzed, never a join over the bucket's range: S26), the new keys made, a move numbered one past
-- the newest for the others. Distributed by Citus, one by one (outbox_move_checkpoint: statements
-- it routes to the shard).
CREATE OR REPLACE FUNCTION outbox_move_checkpoints(
    p_bucket integer,
    p_moves jsonb,
    p_now timestamptz
)
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
SET enable_seqscan = off
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
DECLARE
    m record;
    -- Once, not per move: outbox_queue_slot is a SQL function that no planner inlines (its
    -- body is stable), so a statement calls it for each row it writes.
    v_slot smallint := outbox_queue_slot(p_now);
BEGIN
    IF outbox_distributed('projection_checkpoint_moves') THEN
        FOR m IN
            SELECT x.campaign_id, x.projector, x.applied_seq
            FROM jsonb_to_recordset(p_moves) AS x(campaign_id text, projector text,
                                                  applied_seq bigint)
            ORDER BY x.campaign_id, x.projector
        LOOP
            PERFORM outbox_move_checkpoint(p_bucket, m.campaign_id, m.projector, m.applied_seq,
                                           p_now);
        END LOOP;
        RETURN;
    END IF;
    WITH x AS (
        SELECT x.bucket, x.campaign_id, x.projector, x.applied_seq, k.here, l.n
        FROM (
            SELECT outbox_bucket_in(p_bucket, y.campaign_id) AS bucket, y.*
            FROM jsonb_to_recordset(p_moves) AS y(campaign_id text, projector text,
                                                  applied_seq bigint)
        ) x
        LEFT JOIN LATERAL (
            SELECT true AS here FROM projection_checkpoint_keys k
            WHERE k.bucket = x.bucket AND k.campaign_id = x.campaign_id
              AND k.projector = x.projector
            LIMIT 1
        ) k ON true
        LEFT JOIN LATERAL (
            SELECT v.n FROM projection_checkpoint_moves v
            WHERE v.bucket = x.bucket AND v.campaign_id = x.campaign_id
              AND v.projector = x.projector
            ORDER BY v.n DESC
            LIMIT 1
        ) l ON true
    ), made AS (
        INSERT INTO projection_checkpoint_keys AS k (bucket, campaign_id, projector, applied_seq,
                                                     updated_at)
        SELECT x.bucket, x.campaign_id, x.projector, x.applied_seq, p_now
        FROM x WHERE x.here IS NULL
        ORDER BY x.campaign_id, x.projector
        ON CONFLICT (bucket, campaign_id, projector) DO NOTHING
        RETURNING k.campaign_id, k.projector
    )
    INSERT INTO projection_checkpoint_moves (bucket, campaign_id, projector, n, applied_seq,
                                             moved_at, slot)
    SELECT x.bucket, x.campaign_id, x.projector, coalesce(x.n, 0) + 1, x.applied_seq, p_now,
           v_slot
    FROM x
    WHERE NOT EXISTS (
        SELECT 1 FROM made WHERE made.campaign_id = x.campaign_id AND made.projector = x.projector
    )
    ORDER BY x.campaign_id, x.projector;
END
$$;

-- Back to the default plans on Citus (buckets/distribution_fn.sql).
SELECT outbox_plans_for_citus();
