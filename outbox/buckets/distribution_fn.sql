-- The outbox's hot functions (the claim, the settle, the holds', the checkpoints', the ring's,
-- the one call's check)
-- run with plan_cache_mode force_generic_plan: PostgreSQL's plan cache, guessing an array's 10
-- elements where a batch passes one, judged their generic plans dearer than custom ones and
-- planned every call afresh (2 of the claim's 2.3 ms a call; docs/performance.md). Citus cannot
-- make a distributed plan of some of their statements without the parameters' values ("could
-- not create distributed plan"), so on a database with Citus they go back to the default.
-- Each file that sets the mode calls this after its definitions (so an upgrade that applies it
-- again resets it again), and `maintenance distribute` calls it too (Citus installed after the
-- migrate).
CREATE OR REPLACE FUNCTION outbox_plans_for_citus() RETURNS integer
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    f regprocedure;
    n integer := 0;
BEGIN
    IF to_regclass('pg_catalog.pg_dist_partition') IS NULL THEN
        RETURN 0;
    END IF;
    FOR f IN
        SELECT p.oid::regprocedure FROM pg_catalog.pg_proc p
        WHERE p.pronamespace = current_schema()::regnamespace
          AND 'plan_cache_mode=force_generic_plan' = ANY (p.proconfig)
    LOOP
        EXECUTE format('ALTER FUNCTION %s RESET plan_cache_mode', f);
        n := n + 1;
    END LOOP;
    RETURN n;
END
$$;

-- Whether `p_table`, a table of this install, is distributed by Citus (false where Citus is
-- not installed, or the install not distributed yet): what the functions that work on one
-- server one way and on Citus another ask (the rotation, the checkpoints' moves).
CREATE OR REPLACE FUNCTION outbox_distributed(p_table text) RETURNS boolean
LANGUAGE plpgsql STABLE
SET search_path FROM CURRENT
AS $$
DECLARE
    v_distributed boolean;
BEGIN
    IF to_regclass('pg_catalog.pg_dist_partition') IS NULL THEN
        RETURN false;
    END IF;
    EXECUTE 'SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_dist_partition d '
            'WHERE d.logicalrelid = $1::regclass)'
        INTO v_distributed USING p_table;
    RETURN v_distributed;
END
$$;

-- The bucket a statement reads a campaign's rows in: `p_bucket`, the batch's, when it is one
-- (>= 0: on Citus every batch is, and its statements go to that bucket's shard), else (-1: a
-- batch on one server, whose claim took what was due in every bucket) the campaign's own. Plain
-- SQL, so the planner inlines it: where `p_bucket` is a known value (Citus plans each call with
-- its values) it folds to that constant, the shard key Citus routes by; in a generic plan it is
-- each probe's key, worked out once per campaign.
CREATE OR REPLACE FUNCTION outbox_bucket_in(p_bucket integer, p_campaign_id text)
RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN CASE WHEN p_bucket >= 0 THEN p_bucket ELSE outbox_bucket(p_campaign_id) END;
