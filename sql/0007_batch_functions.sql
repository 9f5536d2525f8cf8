-- A worker's batch in fewer round trips: the claim and the settle as server-side functions.
--
--   outbox_claim(campaigns, budget, projectors, now)
--       the ordered claim in one call: lock up to `campaigns` due campaigns, then read their
--       rows, events and locked checkpoints (the rows the Python worker walks).
--   outbox_lock_heads(campaigns)
--       hold the append heads of campaigns a batch may delete the queue row of.
--   outbox_settle(...)
--       the end of a batch in one call: the append heads of the campaigns it emptied held,
--       then completed rows deleted, failures recorded, campaign rows and checkpoints written.
--
-- Each function runs two statements where the protocol needs two snapshots, and PostgreSQL
-- gives every statement of a VOLATILE function its own snapshot (READ COMMITTED): the load
-- sees the commit of a campaign's previous holder, which the lock waited past; the settle sees
-- an append that committed before the heads were held. One call is one round trip: a batch
-- that ends its campaigns was BEGIN, claim, load, SAVEPOINT, projector, head lock, settle,
-- COMMIT; it is BEGIN, claim, projector, settle, COMMIT.
--
-- Plans are cached per session like any prepared statement's, and a worker's session keeps
-- the ones it made: plans made on a small queue (a fresh deployment, tables analyzed while
-- nearly empty) scanned the work rows, the journal and the checkpoints once per claimed
-- campaign after a backlog grew, until a statistics refresh happened to re-plan them. So the
-- claim and the settle run with enable_seqscan off (it holds only while they run): every
-- table they touch is read by campaign, through its primary key or the claim index, and on a
-- small table a probe costs no more than the scan. The claim's checkpoint lock is a probe per
-- campaign (a LATERAL subquery on the primary key): `campaign_id = ANY (ids) AND projector =
-- ANY (projectors)` let the planner read every checkpoint of the projectors through their
-- index and filter by campaign.

-- The append heads of `p_campaigns` held (FOR SHARE) until the transaction ends, skipping any
-- an append holds now. A campaign row may be deleted only under this lock: an append that
-- comes later waits for the batch to commit, then creates a fresh campaign row; one in flight
-- keeps the campaign row. A campaign with no head row (journal rows written by another tool)
-- has no append to wait for and counts as held.
CREATE FUNCTION outbox_lock_heads(p_campaigns text[])
RETURNS TABLE (campaign_id text)
LANGUAGE sql VOLATILE
AS $$
    WITH held AS (
        SELECT h.campaign_id FROM campaign_heads h
        WHERE h.campaign_id = ANY (p_campaigns)
        ORDER BY h.campaign_id
        FOR SHARE SKIP LOCKED
    )
    SELECT held.campaign_id FROM held
    UNION ALL
    SELECT t.campaign_id FROM unnest(p_campaigns) AS t(campaign_id)
    WHERE NOT EXISTS (SELECT 1 FROM campaign_heads h WHERE h.campaign_id = t.campaign_id)
$$;

-- The ordered claim. First statement: lock up to p_campaigns due campaigns that are not
-- blocked, oldest due first, skipping campaigns other workers hold (the index holds no blocked
-- campaign and the scan stops at the first campaign not due). A campaign locked after its
-- previous holder committed comes back as that holder left it, while that statement's
-- snapshot may predate the commit; the second statement's snapshot sees it. It returns each
-- claimed campaign's rows from its head in seq order, at most p_budget in all (shared among
-- the campaigns, rounded up: one hot campaign gets all of it), with its first and last
-- outstanding seq, the checkpoints of the ordered projectors (p_projectors) locked in a fixed
-- order until the batch commits (a missing one means 0), and each row's event, payload and
-- metadata as text (the worker decodes each row on its own: an undecodable event fails its
-- row, never the claim). A campaign with no rows left comes back as one row with a null seq.
-- A `processing` row (lease mode) is due once its lease expired (its next_attempt_at is its
-- lease expiry). p_now: tests move time with it; null is statement_timestamp(), which is
-- stable, so it bounds the index scan.
CREATE FUNCTION outbox_claim(
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

-- The end of a batch in one call. First statement: hold the append heads of the campaigns
-- the batch left with nothing live (t_gone; outbox_lock_heads). Second statement, whose
-- snapshot sees every append that committed before the heads were held: delete completed rows
-- (d_*); record failures (f_*: attempts, status failed or dead, the next attempt at now +
-- delay, the error); write each campaign's row (t_*): delete it when the batch left it
-- nothing live, its head is held, and no row at or past head_seq (the first seq the batch did
-- not see) exists now; else set its head, blocked flag and due time (the failure's next attempt
-- when the head is a row this batch failed, else t_due, else now). Move the checkpoints of
-- ordered projectors (k_*, sorted: a fixed lock order): the one statement that writes a
-- checkpoint's value. With p_notify and rows deleted, one payload-free NOTIFY on p_channel
-- (readers waiting for their writes look again). Returns how many campaigns are left due now
-- with a head to take (the worker claims again instead of sleeping) and the seconds each
-- deleted row waited since it was enqueued. p_now: null is clock_timestamp().
CREATE FUNCTION outbox_settle(
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
    notified bigint;
BEGIN
    IF true = ANY (t_gone) THEN
        SELECT coalesce(array_agg(h.campaign_id), '{}') INTO held
        FROM outbox_lock_heads(ARRAY(
            SELECT t.c FROM unnest(t_campaigns, t_gone) AS t(c, g) WHERE t.g
        )) h;
    END IF;
    WITH done AS (
        DELETE FROM projection_apply_outbox o
        USING unnest(d_campaigns, d_seqs) AS d(campaign_id, seq)
        WHERE o.campaign_id = d.campaign_id AND o.seq = d.seq
        RETURNING extract(epoch FROM clock_timestamp() - o.enqueued_at)::double precision AS age
    ), failed AS (
        UPDATE projection_apply_outbox o
        SET status = CASE WHEN f.dead THEN 'dead' ELSE 'failed' END,
            attempt_count = f.attempts,
            next_attempt_at = coalesce(p_now, clock_timestamp()) + make_interval(secs => f.delay),
            last_error = f.error,
            updated_at = clock_timestamp()
        FROM unnest(f_campaigns, f_seqs, f_attempts, f_delays, f_errors, f_dead)
            AS f(campaign_id, seq, attempts, delay, error, dead)
        WHERE o.campaign_id = f.campaign_id AND o.seq = f.seq
        RETURNING o.campaign_id, o.seq, o.next_attempt_at
    ), moved AS (
        INSERT INTO projection_checkpoints AS k (campaign_id, projector, applied_seq)
        SELECT m.campaign_id, m.projector, m.applied_seq
        FROM unnest(k_campaigns, k_projectors, k_seqs) AS m(campaign_id, projector, applied_seq)
        ON CONFLICT (campaign_id, projector)
        DO UPDATE SET applied_seq = excluded.applied_seq, updated_at = clock_timestamp()
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
            WHERE o.campaign_id = t.campaign_id AND o.seq >= t.head_seq
        )
    ), gone AS (
        DELETE FROM projection_apply_campaigns c
        USING target t
        WHERE t.gone AND c.campaign_id = t.campaign_id
          AND t.campaign_id NOT IN (SELECT b.campaign_id FROM beyond b)
    ), kept AS (
        -- The batch holds these rows (its claim locked them): an update, no insert.
        UPDATE projection_apply_campaigns c
        SET head_seq = t.head_seq,
            due_at = coalesce(f.next_attempt_at, t.due_at, p_now, clock_timestamp()),
            blocked = t.blocked,
            updated_at = clock_timestamp()
        FROM target t
        LEFT JOIN failed f ON f.campaign_id = t.campaign_id AND f.seq = t.head_seq
        WHERE c.campaign_id = t.campaign_id
          AND (NOT t.gone OR t.campaign_id IN (SELECT b.campaign_id FROM beyond b))
        RETURNING c.head_seq, c.due_at, c.blocked
    )
    SELECT (
        SELECT count(*) FROM kept
        WHERE kept.head_seq > 0 AND NOT kept.blocked
          AND kept.due_at <= coalesce(p_now, clock_timestamp())
    ),
    (SELECT array_agg(done.age) FROM done),
    (SELECT count(pg_notify(p_channel, '')) FROM (SELECT 1 FROM done LIMIT 1) n WHERE p_notify)
    INTO due, ages, notified;
END
$$;
