-- The catch-up engine's server functions (`build.py`, S30): the next campaigns of a bucket,
-- their checkpoint keys made, then locked for a step; a bucket held by one build.
-- requires: projection/guards_fn.sql

-- The next `p_campaigns` campaigns of the journal in bucket `p_bucket` after `p_after` (null:
-- from the first), in key order, each with ordered projector `p_projector`'s checkpoint key
-- made at 0 when it had none (it starts at the beginning). Called in a transaction of its own,
-- committed before the step that locks them (`outbox_build_step`): a batch that claims one of
-- these campaigns from then on finds the key and waits for the step's lock, where a key made in
-- the step itself would be invisible to it, and it would apply the campaign from 0 beside the
-- build.
CREATE OR REPLACE FUNCTION outbox_build_keys(
    p_projector text,
    p_bucket integer,
    p_after text,
    p_campaigns integer
)
RETURNS text[]
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
SET enable_seqscan = off
SET jit = off
AS $$
DECLARE
    cs text[];
BEGIN
    cs := ARRAY(
        SELECT h.campaign_id
        FROM campaign_head_keys h
        WHERE h.bucket = p_bucket AND (p_after IS NULL OR h.campaign_id > p_after)
        ORDER BY h.campaign_id
        LIMIT p_campaigns
    );
    INSERT INTO projection_checkpoint_keys (bucket, campaign_id, projector, applied_seq)
    SELECT p_bucket, c, p_projector, 0
    FROM unnest(cs) AS c
    ORDER BY c
    ON CONFLICT (bucket, campaign_id, projector) DO NOTHING;
    RETURN cs;
END
$$;

-- One step of a build of ordered projector `p_projector` in bucket `p_bucket`, over campaigns
-- `p_campaigns` (their keys made by `outbox_build_keys`). A campaign with a campaign row (live
-- work, a catch-up hold) is taken only when no batch holds that row (probed FOR UPDATE SKIP
-- LOCKED, as a batch's claim locks it, before the keys, and let go of at once): a batch that
-- holds the row may have read the key as missing (0) before it was made, and heals the
-- projector itself (S17, S25). Then the keys of the campaigns taken are locked FOR UPDATE SKIP
-- LOCKED: one a batch or another build holds is skipped, never waited for (`locked` false). Then, in
-- statements of their own (READ COMMITTED: they see every move committed before the locks),
-- each locked campaign's checkpoint and head. A build that goes past a campaign's queued rows
-- leaves them to its batches, where the projector skips them as duplicates. Every campaign
-- comes back, in key order.
CREATE OR REPLACE FUNCTION outbox_build_step(
    p_projector text,
    p_bucket integer,
    p_campaigns text[]
)
RETURNS TABLE (campaign_id text, locked boolean, applied_seq bigint, last_seq bigint)
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
SET enable_seqscan = off
SET jit = off
AS $$
#variable_conflict use_column
DECLARE
    queued text[];
    taken text[];
    held text[];
    kc text[];
    ks bigint[];
    hc text[];
    hs bigint[];
    owing text[];
    free text[];
BEGIN
    PERFORM outbox_require_read_committed();
    queued := ARRAY(
        SELECT q.campaign_id FROM projection_apply_campaigns q
        WHERE q.bucket = p_bucket AND q.campaign_id = ANY (p_campaigns)
    );
    -- The projector's own holds at seq 0 (a worker group's queue, S35, or a catch-up hold): a
    -- worker group's batch holds the hold row as a default batch holds the campaign row.
    owing := ARRAY(
        SELECT h.campaign_id FROM projection_holds h
        WHERE h.bucket = p_bucket AND h.campaign_id = ANY (p_campaigns)
          AND h.projector = p_projector AND h.seq = 0
    );
    -- A probe, not a hold: the rows are locked in a subtransaction rolled back at once, which
    -- lets go of them (the variable keeps what it found). A batch that held one from before
    -- its key was made is skipped; one that claims a campaign from now on finds the key and
    -- waits for the step's lock of it, so the step holds nothing a batch that does not run
    -- this projector needs.
    BEGIN
        taken := ARRAY(
            SELECT q.campaign_id FROM projection_apply_campaigns q
            WHERE q.bucket = p_bucket AND q.campaign_id = ANY (queued)
            ORDER BY q.campaign_id
            FOR UPDATE SKIP LOCKED
        );
        free := ARRAY(
            SELECT h.campaign_id FROM projection_holds h
            WHERE h.bucket = p_bucket AND h.campaign_id = ANY (owing)
              AND h.projector = p_projector AND h.seq = 0
            ORDER BY h.campaign_id
            FOR UPDATE SKIP LOCKED
        );
        RAISE EXCEPTION USING ERRCODE = 'OB900';  -- never escapes: the probe's end
    EXCEPTION WHEN SQLSTATE 'OB900' THEN
        NULL;
    END;
    held := ARRAY(
        SELECT k.campaign_id
        FROM projection_checkpoint_keys k
        WHERE k.bucket = p_bucket AND k.campaign_id = ANY (p_campaigns)
          AND k.projector = p_projector
          AND (NOT k.campaign_id = ANY (queued) OR k.campaign_id = ANY (taken))
          AND (NOT k.campaign_id = ANY (owing) OR k.campaign_id = ANY (free))
        ORDER BY k.campaign_id
        FOR UPDATE SKIP LOCKED
    );
    -- Statements on arrays, not one join: Citus plans each of these alone.
    SELECT coalesce(array_agg(k.campaign_id), '{}'), coalesce(array_agg(k.applied_seq), '{}')
    INTO kc, ks
    FROM outbox_checkpoints_of(p_bucket, held, ARRAY[p_projector]) k;
    SELECT coalesce(array_agg(h.campaign_id), '{}'), coalesce(array_agg(h.last_seq), '{}')
    INTO hc, hs
    FROM campaign_heads h
    WHERE h.bucket = p_bucket AND h.campaign_id = ANY (p_campaigns);
    RETURN QUERY
    SELECT c.c, k.c IS NOT NULL, k.s, h.s
    FROM unnest(p_campaigns) AS c(c)
    LEFT JOIN unnest(kc, ks) AS k(c, s) ON k.c = c.c
    LEFT JOIN unnest(hc, hs) AS h(c, s) ON h.c = c.c
    ORDER BY c.c;
END
$$;

-- The advisory lock key of projector `p_projector`'s build (with a bucket, or -1: the whole
-- build, which the sweep asks about), one per install (the schema) and projector.
CREATE OR REPLACE FUNCTION outbox_build_key(p_projector text)
RETURNS integer
LANGUAGE sql STABLE
SET search_path FROM CURRENT
AS $$
    SELECT hashtext(current_schema() || '.outbox_build.' || p_projector)
$$;

-- Hold (`p_lock`) or let go of bucket `p_bucket` of projector `p_projector`'s build, for this
-- session: one build walks a bucket at a time, and another finds it held (false) and takes the
-- next. Bucket -1 is the build as a whole, held while it runs: the workers' sweep of the
-- projector seeds no catch-up hold meanwhile (`outbox_sweep`), so that the workers do not
-- catch up the campaigns the build is about to. A session lock, so that it outlives the build's
-- steps (each a transaction); a lost connection lets go of it.
CREATE OR REPLACE FUNCTION outbox_lock_build_bucket(
    p_projector text,
    p_bucket integer,
    p_lock boolean
)
RETURNS boolean
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
AS $$
DECLARE
    v_key integer := outbox_build_key(p_projector);
BEGIN
    IF p_lock THEN
        RETURN pg_try_advisory_lock(v_key, p_bucket);
    END IF;
    RETURN pg_advisory_unlock(v_key, p_bucket);
END
$$;
