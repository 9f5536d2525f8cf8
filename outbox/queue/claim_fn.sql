-- The claim's server functions (`claim.py`): the ordered claim in one call, and the append
-- heads' lock that the claim's callers and the settle share.
-- requires: buckets/distribution_fn.sql
-- requires: projection/guards_fn.sql
--
-- Each function runs two statements where the protocol needs two snapshots: PostgreSQL gives
-- every statement of a VOLATILE function its own snapshot (READ COMMITTED), so the statement
-- after a lock sees the commit the lock waited for. One call is one round trip.
--
-- Plans are cached per session like any prepared statement's, and a worker's session keeps the
-- ones it made: plans made on a small queue (a fresh deployment, tables analyzed while nearly
-- empty) scanned the work rows, the journal and the checkpoints once per claimed campaign after
-- a backlog grew. So the claim runs with enable_seqscan off (it holds only while it runs):
-- every table it touches is read by campaign, through its primary key or the claim index, and
-- on a small table a probe costs no more than the scan. And with jit off: a statement left
-- with a sequential scan (a small table no index serves) costs 1e10 to the planner then, far
-- past the JIT thresholds, and compiling it took 100 ms a call (the settle's check of the
-- recorded projectors did, in the first version of the holds). And with plan_cache_mode
-- force_generic_plan: PostgreSQL's plan cache compares a generic plan's estimate with the
-- custom plans' and, guessing an array's 10 elements where a batch passes one, it judged the
-- generic plan dearer and planned every call afresh. That planning was 2 of the claim's 2.3 ms
-- a call (pgbench, one campaign claimed: 2.35 ms, then 0.37 ms). The generic plans are the
-- probes above (test_claim_plan.py). The checkpoints are locked and read by
-- `outbox_lock_checkpoints` (projection/guards_fn.sql), a probe per key.

-- The append heads of `p_campaigns` (all in bucket `p_bucket`; -1: each in its own,
-- `outbox_bucket_in`) held (FOR SHARE, in campaign order) until the transaction ends, skipping
-- any an append holds now. A campaign row may be deleted only under this lock: an append that
-- comes later waits for the batch to commit, then creates a fresh campaign row; one in flight
-- keeps the campaign row. A campaign with no head row
-- (journal rows written by another tool) has no append to wait for and counts as held.
CREATE OR REPLACE FUNCTION outbox_lock_heads(p_bucket integer, p_campaigns text[])
RETURNS TABLE (campaign_id text)
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
AS $$
#variable_conflict use_column
DECLARE
    held text[];
BEGIN
    SELECT coalesce(array_agg(x.campaign_id), '{}') INTO held
    FROM (
        SELECT h.campaign_id
        FROM (SELECT DISTINCT u.c FROM unnest(p_campaigns) AS u(c) ORDER BY u.c) AS t(campaign_id)
        CROSS JOIN LATERAL (
            SELECT h.campaign_id FROM campaign_head_keys h
            WHERE h.bucket = outbox_bucket_in(p_bucket, t.campaign_id)
              AND h.campaign_id = t.campaign_id
            FOR SHARE SKIP LOCKED
        ) h
    ) x;
    RETURN QUERY
    SELECT t.campaign_id FROM unnest(held) AS t(campaign_id)
    UNION ALL
    SELECT t.campaign_id FROM unnest(p_campaigns) AS t(campaign_id)
    WHERE NOT t.campaign_id = ANY (held)
      AND NOT EXISTS (
          SELECT 1 FROM campaign_head_keys h
          WHERE h.bucket = outbox_bucket_in(p_bucket, t.campaign_id)
            AND h.campaign_id = t.campaign_id
      );
END
$$;

-- The ordered claim in bucket `p_bucket`, or in every bucket (-1: a worker on one server; each
-- campaign's rows read in its own bucket, `outbox_bucket_in`). First statement: lock up to
-- p_campaigns due campaigns that are not blocked, oldest due first, skipping campaigns other
-- workers hold (the index holds no blocked campaign and the scan stops at the first campaign
-- not due: the install's due-order index, or the bucket's, which Citus plans with the
-- bucket's value). A
-- campaign locked after its previous holder committed comes back as that holder left it,
-- while that statement's snapshot may predate the commit; the second statement's snapshot
-- sees it. It returns each claimed campaign's rows from its head in seq order, at most
-- p_budget in all (shared among the campaigns, rounded up: one hot campaign gets all of it),
-- with its first and last outstanding seq, the checkpoints of the ordered projectors
-- (p_projectors) locked in a fixed order until the batch commits (a missing one means 0), the
-- campaign's holds (`projection_holds`, as JSON; null: none), and each row's event, payload and metadata as text (the worker decodes each row on its own: an
-- undecodable event fails its row, never the claim). A campaign with no rows left comes back
-- as one row with a null seq. A `processing` row (lease mode) is due once its lease expired
-- (its next_attempt_at is its lease expiry). p_now: tests move time with it; null is
-- statement_timestamp(), which is stable, so it bounds the index scan. p_take (S25): 'all', or
-- 'live' (a batch that serves appends first: a campaign that waits for holds alone, head_seq 0,
-- a projector catching up or a hold's retry, is left for a background batch), or 'holds' (a
-- background worker's batch: those alone).
-- (The release before took no p_take: that signature goes, so one function answers. Each
-- row's event version (issue 62) is a column of its result: the result's type changed, so the
-- function is made again.)
DROP FUNCTION IF EXISTS outbox_claim(integer, integer, integer, text[], timestamptz);
DO $$
BEGIN
    IF EXISTS (
        SELECT 1 FROM pg_catalog.pg_proc p
        WHERE p.oid = to_regprocedure(
                  'outbox_claim(integer, integer, integer, text[], timestamptz, text)')
          AND NOT 'version' = ANY (p.proargnames)
    ) THEN
        DROP FUNCTION outbox_claim(integer, integer, integer, text[], timestamptz, text);
    END IF;
END
$$;

CREATE OR REPLACE FUNCTION outbox_claim(
    p_bucket integer,
    p_campaigns integer,
    p_budget integer,
    p_projectors text[],
    p_now timestamptz DEFAULT NULL,
    p_take text DEFAULT 'all'
)
RETURNS TABLE (
    campaign_id text,
    due boolean,
    first_seq bigint,
    last_seq bigint,
    projectors text[],
    applied_seqs bigint[],
    holds text,
    seq bigint,
    status text,
    attempt_count integer,
    next_attempt_at timestamptz,
    lease_owner text,
    claim_epoch bigint,
    event_type text,
    payload text,
    metadata text,
    recorded_at timestamptz,
    version integer
)
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
SET enable_seqscan = off
SET plan_cache_mode = force_generic_plan
SET jit = off
AS $$
#variable_conflict use_column
DECLARE
    ids text[];
    heads bigint[];
    cp_campaigns text[];
    cp_projectors text[];
    cp_seqs bigint[];
    v_now timestamptz := coalesce(p_now, statement_timestamp());
BEGIN
    SELECT array_agg(c.campaign_id ORDER BY c.campaign_id),
           array_agg(c.head_seq ORDER BY c.campaign_id)
    INTO ids, heads
    FROM (
        SELECT q.campaign_id, q.head_seq
        FROM projection_apply_campaigns q
        WHERE (p_bucket < 0 OR q.bucket = p_bucket) AND NOT q.blocked AND q.due_at <= v_now
          AND (p_take = 'all' OR (p_take = 'live') = (q.head_seq > 0))
        ORDER BY q.due_at
        LIMIT p_campaigns
        FOR UPDATE SKIP LOCKED
    ) c;
    IF ids IS NULL THEN
        RETURN;
    END IF;
    -- The checkpoints, locked by key and then read (a statement of their own, since the read
    -- must follow the lock: `outbox_lock_checkpoints`).
    IF cardinality(p_projectors) > 0 THEN
        SELECT array_agg(k.campaign_id), array_agg(k.projector), array_agg(k.applied_seq)
        INTO cp_campaigns, cp_projectors, cp_seqs
        FROM outbox_lock_checkpoints(p_bucket, ids, p_projectors) k;
    END IF;
    RETURN QUERY
    SELECT p.campaign_id,
           o.status IN ('pending', 'failed', 'processing') AND o.next_attempt_at <= v_now,
           p.first_seq, p.last_seq, k.projectors, k.applied_seqs, hd.holds,
           o.seq, o.status, o.attempt_count, o.next_attempt_at, o.lease_owner, o.claim_epoch,
           j.event_type, j.payload::text, j.metadata::text, j.recorded_at, j.version
    FROM (
        -- Per campaign, once (OFFSET 0: not again for each of its rows). The first seq leaves
        -- out a dead row that stands for dead holds alone (S24: each holds only its projector,
        -- out of the claim's way), not a row's own death (S8). Each an index scan that stops
        -- at its first row (an aggregate would read the campaign).
        SELECT u.campaign_id, u.head_seq,
               (SELECT x.seq FROM projection_apply_outbox x
                WHERE x.bucket = outbox_bucket_in(p_bucket, u.campaign_id)
                  AND x.campaign_id = u.campaign_id
                  AND (x.status <> 'dead' OR NOT EXISTS (
                      SELECT 1 FROM projection_holds y
                      WHERE y.bucket = outbox_bucket_in(p_bucket, u.campaign_id)
                        AND y.campaign_id = u.campaign_id AND y.seq = x.seq))
                ORDER BY x.seq LIMIT 1) AS first_seq,
               (SELECT max(x.seq) FROM projection_apply_outbox x
                WHERE x.bucket = outbox_bucket_in(p_bucket, u.campaign_id)
                  AND x.campaign_id = u.campaign_id) AS last_seq
        FROM unnest(ids, heads) AS u(campaign_id, head_seq)
        OFFSET 0
    ) p
    CROSS JOIN LATERAL (
        SELECT array_agg(c.projector) AS projectors, array_agg(c.applied_seq) AS applied_seqs
        FROM unnest(cp_campaigns, cp_projectors, cp_seqs) AS c(campaign_id, projector, applied_seq)
        WHERE c.campaign_id = p.campaign_id
    ) k
    CROSS JOIN LATERAL (
        -- The campaign's holds (S24), usually none: one probe of an empty index range. (No
        -- function call here: Citus runs this statement on the shard, where a function that
        -- reads a distributed table may not run.)
        SELECT jsonb_agg(jsonb_build_object(
                   'projector', h.projector, 'seq', h.seq, 'status', h.status,
                   'attempts', h.attempt_count, 'next', h.next_attempt_at,
                   'due', h.status <> 'dead' AND h.next_attempt_at <= v_now,
                   'from', h.from_seq)
                   ORDER BY h.projector, h.seq)::text AS holds
        FROM projection_holds h
        WHERE h.bucket = outbox_bucket_in(p_bucket, p.campaign_id)
          AND h.campaign_id = p.campaign_id
    ) hd
    LEFT JOIN LATERAL (
        SELECT x.seq, x.status, x.attempt_count, x.next_attempt_at, x.lease_owner,
               x.claim_epoch
        FROM projection_apply_outbox x
        WHERE x.bucket = outbox_bucket_in(p_bucket, p.campaign_id) AND x.campaign_id = p.campaign_id
          AND x.seq >= p.head_seq
        ORDER BY x.seq
        LIMIT (p_budget + cardinality(ids) - 1) / cardinality(ids)
    ) o ON true
    LEFT JOIN LATERAL (
        -- One index probe per row. OFFSET 0 keeps it a probe: a generic plan guesses the
        -- rows per campaign high and would join the whole journal by hash.
        SELECT e.event_type, e.payload, e.metadata, e.recorded_at, e.version
        FROM event_journal e
        WHERE e.bucket = outbox_bucket_in(p_bucket, p.campaign_id) AND e.campaign_id = p.campaign_id
          AND e.seq = o.seq
        OFFSET 0
    ) j ON true
    ORDER BY p.campaign_id, o.seq;
END
$$;

-- A worker group's claim (S35), on one server: up to p_limit due holds of its projectors
-- (`p_projectors`, each ordered), oldest due first per projector, skipping holds other
-- batches hold (the hold is the group's unit of work, as a campaign is the default group's),
-- then, in a statement after those locks, the checkpoints of those projectors on the holds'
-- campaigns, locked in a fixed order (`outbox_lock_checkpoints`). One row per campaign: the
-- checkpoints (as `outbox_claim` returns them) and the claimed holds (as JSON, each due); no
-- work row (a group's projectors go on from their checkpoints through the journal).
CREATE OR REPLACE FUNCTION outbox_claim_holds(
    p_projectors text[],
    p_limit integer,
    p_now timestamptz DEFAULT NULL
)
RETURNS TABLE (campaign_id text, projectors text[], applied_seqs bigint[], holds text)
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
SET enable_seqscan = off
SET plan_cache_mode = force_generic_plan
SET jit = off
AS $$
#variable_conflict use_column
DECLARE
    taken jsonb;
    ids text[];
    v_now timestamptz := coalesce(p_now, statement_timestamp());
BEGIN
    SELECT jsonb_agg(jsonb_build_object(
               'campaign_id', x.campaign_id, 'projector', x.projector, 'seq', x.seq,
               'status', x.status, 'attempts', x.attempt_count, 'next', x.next_attempt_at,
               'due', true, 'from', x.from_seq)),
           array_agg(DISTINCT x.campaign_id)
    INTO taken, ids
    FROM (
        SELECT h.*
        FROM unnest(p_projectors) AS p(name)
        CROSS JOIN LATERAL (
            SELECT h.campaign_id, h.projector, h.seq, h.status, h.attempt_count,
                   h.next_attempt_at, h.from_seq
            FROM projection_holds h
            WHERE h.projector = p.name AND h.status <> 'dead' AND h.next_attempt_at <= v_now
            ORDER BY h.next_attempt_at
            LIMIT p_limit
            FOR UPDATE SKIP LOCKED
        ) h
    ) x;
    IF ids IS NULL THEN
        RETURN;
    END IF;
    RETURN QUERY
    SELECT t.campaign_id, k.projectors, k.applied_seqs, hd.holds
    FROM unnest(ids) AS t(campaign_id)
    CROSS JOIN LATERAL (
        SELECT jsonb_agg(c.value - 'campaign_id' ORDER BY c.value ->> 'projector')::text AS holds
        FROM jsonb_array_elements(taken) AS c(value)
        WHERE c.value ->> 'campaign_id' = t.campaign_id
    ) hd
    LEFT JOIN (
        SELECT c.campaign_id, array_agg(c.projector) AS projectors,
               array_agg(c.applied_seq) AS applied_seqs
        FROM outbox_lock_checkpoints(-1, ids, p_projectors) c
        GROUP BY c.campaign_id
    ) k ON k.campaign_id = t.campaign_id
    ORDER BY t.campaign_id;
END
$$;

-- Back to the default plans on Citus (buckets/distribution_fn.sql).
SELECT outbox_plans_for_citus();
