-- Plans that stay index probes whatever the statistics say and however long a session has
-- cached them (migration 0007's claim and settle; signatures and results unchanged).
--
-- A worker's session plans the functions' statements once and keeps the plans. Plans made on
-- a small queue (a fresh deployment, tables analyzed while nearly empty) scan: the claim read
-- the work rows, the journal and the checkpoints once per claimed campaign, the settle the
-- work rows and the heads. A backlog that grows during an outage then costs every batch the
-- whole backlog, until a statistics refresh happens to re-plan the session's statements.
-- - Both functions run with enable_seqscan off: every table they touch is read by campaign,
--   through its primary key or the claim index, and on a small table a probe costs no more
--   than the scan. The setting holds only while the function runs.
-- - The claim's checkpoint lock is a probe per campaign (a LATERAL subquery on the primary
--   key): `campaign_id = ANY (ids) AND projector = ANY (projectors)` let the planner read
--   every checkpoint of the projectors through their index and filter by campaign.

-- The ordered claim (see migration 0007): the checkpoints are locked campaign by campaign, in
-- campaign then projector order, each through the primary key.
CREATE OR REPLACE FUNCTION outbox_claim(
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
BEGIN
    SELECT array_agg(c.campaign_id ORDER BY c.campaign_id),
           array_agg(c.head_seq ORDER BY c.campaign_id)
    INTO ids, heads
    FROM (
        SELECT q.campaign_id, q.head_seq
        FROM projection_apply_campaigns q
        WHERE NOT q.blocked AND q.due_at <= coalesce(p_now, statement_timestamp())
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
        FROM (SELECT DISTINCT u.c FROM unnest(ids) AS u(c) ORDER BY u.c) AS t(campaign_id)
        CROSS JOIN LATERAL (
            SELECT k.projector, k.applied_seq
            FROM projection_checkpoints k
            WHERE k.campaign_id = t.campaign_id AND k.projector = ANY (p_projectors)
            ORDER BY k.projector
            FOR UPDATE
        ) k
    )
    SELECT p.campaign_id,
           o.status IN ('pending', 'failed', 'processing')
               AND o.next_attempt_at <= coalesce(p_now, statement_timestamp()),
           b.first_seq, b.last_seq, k.projectors, k.applied_seqs,
           o.seq, o.status, o.attempt_count, o.next_attempt_at, o.lease_owner, o.claim_epoch,
           j.event_type, j.payload::text, j.metadata::text, j.recorded_at
    FROM unnest(ids, heads) AS p(campaign_id, head_seq)
    CROSS JOIN LATERAL (
        SELECT min(x.seq) AS first_seq, max(x.seq) AS last_seq
        FROM projection_apply_outbox x
        WHERE x.campaign_id = p.campaign_id
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
        WHERE x.campaign_id = p.campaign_id AND x.seq >= p.head_seq
        ORDER BY x.seq
        LIMIT (p_budget + cardinality(ids) - 1) / cardinality(ids)
    ) o ON true
    LEFT JOIN LATERAL (
        -- One index probe per row. OFFSET 0 keeps it a probe: a generic plan guesses the
        -- rows per campaign high and would join the whole journal by hash.
        SELECT e.event_type, e.payload, e.metadata, e.recorded_at
        FROM event_journal e
        WHERE e.campaign_id = p.campaign_id AND e.seq = o.seq
        OFFSET 0
    ) j ON true
    ORDER BY p.campaign_id, o.seq;
END
$$;

-- The settle: every statement it runs (the heads lock included) through an index.
ALTER FUNCTION outbox_settle(
    text[], bigint[], text[], bigint[], integer[], double precision[], text[], boolean[],
    timestamptz, text[], bigint[], timestamptz[], boolean[], boolean[], text[], text[], bigint[],
    boolean, text
) SET enable_seqscan = off;
