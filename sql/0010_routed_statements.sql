-- What makes every statement on the campaign-keyed tables run on one Citus shard (one router
-- task) while keeping plain PostgreSQL's plans: a clock for writes, and the operator reports'
-- loose index scans run bucket by bucket.
--
-- The statement clock for writes that take an optional instant: `outbox_now(p)` is `p`, or the
-- statement's timestamp when `p` is null (the worker passes null; tests pass an instant).
--
-- A statement that writes a distributed table on Citus may call a stable function only with
-- constants and parameters (Citus evaluates it on the coordinator and routes the result), and
-- no function at all inside COALESCE or CASE; `coalesce($n, statement_timestamp())` breaks the
-- second rule, `outbox_now($n)` keeps both. PL/pgSQL, so that no planner inlines it back into a
-- COALESCE. On plain PostgreSQL it is the same instant as before.
CREATE FUNCTION outbox_now(p_at timestamptz) RETURNS timestamptz
    LANGUAGE plpgsql STABLE PARALLEL SAFE AS $$
BEGIN
    RETURN coalesce(p_at, statement_timestamp());
END
$$;

-- The reports' loose index scans (one descent of the primary key per campaign with rows), run
-- in one bucket at a time: a recursive query on Citus must name its shard in every reference.
-- Each function loops over the buckets (or the one given) and returns per-bucket results the
-- calling statement orders and limits; on plain PostgreSQL the loop costs one short scan per
-- bucket more than the single scan did.

-- Per bucket, the claimable row waiting longest (by enqueued_at): a pending or failed campaign
-- head (campaign p_campaign in bucket p_bucket, or all); under park dead rows step aside.
CREATE FUNCTION outbox_oldest_claimable(p_campaign text, p_bucket integer, p_park boolean)
    RETURNS TABLE (campaign_id text, seq bigint, enqueued_at timestamptz)
    LANGUAGE plpgsql STABLE AS $$
DECLARE
    b integer;
BEGIN
    FOR b IN SELECT g FROM generate_series(0, outbox_bucket_count() - 1) AS g
             WHERE p_bucket IS NULL OR g = p_bucket LOOP
        RETURN QUERY
        WITH RECURSIVE heads AS (
            (
                SELECT o.campaign_id, o.seq, o.status, o.enqueued_at
                FROM projection_apply_outbox o
                WHERE o.bucket = b AND (p_campaign IS NULL OR o.campaign_id = p_campaign)
                  AND NOT (p_park AND o.status = 'dead')
                ORDER BY o.bucket, o.campaign_id, o.seq
                LIMIT 1
            )
            UNION ALL
            SELECT n.campaign_id, n.seq, n.status, n.enqueued_at
            FROM heads h
            CROSS JOIN LATERAL (
                SELECT o.campaign_id, o.seq, o.status, o.enqueued_at
                FROM projection_apply_outbox o
                WHERE o.bucket = b AND p_campaign IS NULL AND o.campaign_id > h.campaign_id
                  AND NOT (p_park AND o.status = 'dead')
                ORDER BY o.bucket, o.campaign_id, o.seq
                LIMIT 1
            ) n
        )
        SELECT h.campaign_id, h.seq, h.enqueued_at
        FROM heads h
        WHERE h.status IN ('pending', 'failed')
        ORDER BY h.enqueued_at, h.seq
        LIMIT 1;
    END LOOP;
END
$$;

-- The blocked campaigns (campaign p_campaign in bucket p_bucket, or all): those whose first
-- outstanding row is failed or dead (under park dead rows step aside and block nothing), found
-- per bucket from the attention index; the oldest head first, at most p_limit, each with the
-- rows waiting behind it counted up to p_waiting (null: all), and `total`, how many campaigns
-- are blocked whatever the limit. (Failed or dead is written "neither pending nor processing":
-- the planner's estimate of a rare IN list made it read every such row and sort them, instead
-- of the first one in index order.)
CREATE FUNCTION outbox_blocked_campaigns(
    p_campaign text, p_bucket integer, p_park boolean, p_limit integer, p_waiting integer
)
    RETURNS TABLE (campaign_id text, blocking_seq bigint, status text, enqueued_at timestamptz,
                   waiting bigint, total bigint)
    LANGUAGE plpgsql STABLE AS $$
DECLARE
    b integer;
    found_bucket integer[] := '{}';
    found_campaign text[] := '{}';
    found_seq bigint[] := '{}';
    found_status text[] := '{}';
    found_at timestamptz[] := '{}';
    r record;
BEGIN
    FOR b IN SELECT g FROM generate_series(0, outbox_bucket_count() - 1) AS g
             WHERE p_bucket IS NULL OR g = p_bucket LOOP
        FOR r IN
            WITH RECURSIVE firsts AS (
                (
                    SELECT o.campaign_id, o.seq
                    FROM projection_apply_outbox o
                    WHERE o.bucket = b AND o.status <> 'pending' AND o.status <> 'processing'
                      AND NOT (p_park AND o.status = 'dead')
                      AND (p_campaign IS NULL OR o.campaign_id = p_campaign)
                    ORDER BY o.bucket, o.campaign_id, o.seq
                    LIMIT 1
                )
                UNION ALL
                SELECT n.campaign_id, n.seq
                FROM firsts f
                CROSS JOIN LATERAL (
                    SELECT o.campaign_id, o.seq
                    FROM projection_apply_outbox o
                    WHERE o.bucket = b AND o.status <> 'pending' AND o.status <> 'processing'
                      AND NOT (p_park AND o.status = 'dead')
                      AND p_campaign IS NULL AND o.campaign_id > f.campaign_id
                    ORDER BY o.bucket, o.campaign_id, o.seq
                    LIMIT 1
                ) n
            )
            SELECT o.campaign_id, o.seq, o.status, o.enqueued_at
            FROM firsts f
            JOIN projection_apply_outbox o
                ON o.bucket = b AND o.campaign_id = f.campaign_id AND o.seq = f.seq
            WHERE NOT EXISTS (
                SELECT 1 FROM projection_apply_outbox e
                WHERE e.bucket = b AND e.campaign_id = f.campaign_id AND e.seq < f.seq
                  AND NOT (p_park AND e.status = 'dead')
            )
        LOOP
            found_bucket := found_bucket || b;
            found_campaign := found_campaign || r.campaign_id;
            found_seq := found_seq || r.seq;
            found_status := found_status || r.status;
            found_at := found_at || r.enqueued_at;
        END LOOP;
    END LOOP;
    total := cardinality(found_campaign);
    FOR r IN
        SELECT u.b, u.c, u.s, u.st, u.at
        FROM unnest(found_bucket, found_campaign, found_seq, found_status, found_at)
            AS u(b, c, s, st, at)
        ORDER BY u.at, u.c
        LIMIT p_limit
    LOOP
        campaign_id := r.c;
        blocking_seq := r.s;
        status := r.st;
        enqueued_at := r.at;
        SELECT count(*) INTO waiting FROM (
            SELECT 1 FROM projection_apply_outbox w
            WHERE w.bucket = r.b AND w.campaign_id = r.c AND w.seq > r.s
            LIMIT p_waiting
        ) AS behind;
        RETURN NEXT;
    END LOOP;
END
$$;

-- Which buckets have due work: one probe per bucket, as 0009 wrote it, except that a bucket
-- whose shard is on a node that cannot be reached (Citus: connection_failure) is left out of
-- this answer instead of failing it, so workers keep claiming in the buckets of the nodes that
-- are up; the next read asks again. On plain PostgreSQL no probe fails this way.
CREATE OR REPLACE FUNCTION outbox_due_buckets(p_rows boolean, p_after timestamptz)
RETURNS TABLE (bucket integer, due_at timestamptz)
LANGUAGE plpgsql STABLE
AS $$
#variable_conflict use_column
DECLARE
    b integer;
    at timestamptz;
BEGIN
    FOR b IN 0 .. outbox_bucket_count() - 1 LOOP
        BEGIN
            IF p_rows THEN
                SELECT min(o.next_attempt_at) INTO at FROM projection_apply_outbox o
                WHERE o.bucket = b AND o.status IN ('pending', 'failed')
                  AND o.next_attempt_at > p_after;
            ELSE
                SELECT min(c.due_at) INTO at FROM projection_apply_campaigns c
                WHERE c.bucket = b AND NOT c.blocked AND c.due_at > p_after;
            END IF;
        EXCEPTION WHEN connection_failure THEN
            at := NULL;
        END;
        IF at IS NOT NULL THEN
            bucket := b;
            due_at := at;
            RETURN NEXT;
        END IF;
    END LOOP;
END
$$;
