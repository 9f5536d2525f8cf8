-- The operators' reads' server functions (`inspect.py`): the failure groups' shape of an
-- error, and the reports' loose index scans (one descent of the primary key per campaign with
-- rows), run one bucket at a time: a recursive query on Citus must name its shard in every
-- reference. Each scan loops over the buckets (or the one given) and returns per-bucket
-- results the calling statement orders and limits; on plain PostgreSQL the loop costs one
-- short scan per bucket more than a single scan would.
--
-- The error functions run per row of a failure report: SQL-standard bodies, which PostgreSQL
-- binds when they are created (no caller's search_path reaches them) and may inline.

-- Error groups: failed and dead rows grouped by the projector that raised and the shape of the
-- error, so one poisoned projector's thousand rows read as one line and requeue as one group.
-- `last_error` is `Type: message` on one line, prefixed `projector 'name': ` when a projector
-- raised it. The shape is the error without that prefix (the projector is named apart), with
-- what varies between occurrences of one failure, quoted values and (signed) numbers,
-- replaced by `?` (one regular expression, which turns the prefix into `projector ?: `, then
-- a string test that drops it: these run per row). The fingerprint names a group in commands
-- and URLs: 12 hex digits of the MD5 of the projector and the shape.
CREATE OR REPLACE FUNCTION outbox_error_projector(error text) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN substring(error FROM '^projector [''"](.*?)[''"]: ');

CREATE OR REPLACE FUNCTION outbox_error_shape(error text) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN (
    SELECT CASE WHEN starts_with(m.shape, 'projector ?: ') THEN substr(m.shape, 14) ELSE m.shape END
    FROM (SELECT regexp_replace(error, '''[^'']*''|"[^"]*"|-?[0-9]+(\.[0-9]+)?', '?', 'g') AS shape) m
);

CREATE OR REPLACE FUNCTION outbox_error_fingerprint(projector text, shape text) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN left(md5(coalesce(projector, '') || E'\n' || coalesce(shape, '')), 12);

-- Per bucket, the claimable row waiting longest (by enqueued_at): a pending or failed campaign
-- head (campaign p_campaign in bucket p_bucket, or all); under park dead rows step aside.
CREATE OR REPLACE FUNCTION outbox_oldest_claimable(p_campaign text, p_bucket integer, p_park boolean)
    RETURNS TABLE (campaign_id text, seq bigint, enqueued_at timestamptz)
    LANGUAGE plpgsql STABLE
    SET search_path FROM CURRENT
    AS $$
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
-- outstanding row is failed or dead by a failure of its own, not a projector's hold (S24;
-- under park dead rows step aside and block nothing), found
-- per bucket from the attention index; the oldest head first, at most p_limit (after head
-- time and campaign p_after_at, p_after_campaign: a page's cursor; null: from the first),
-- each with the rows waiting behind it counted up to p_waiting (null: all), and `total`, how
-- many campaigns are blocked whatever the limit or the cursor. (The release before took no
-- cursor: that signature goes, and its calls reach this one.) (Failed or dead is written "neither pending nor processing":
-- the planner's estimate of a rare IN list made it read every such row and sort them, instead
-- of the first one in index order.)
DROP FUNCTION IF EXISTS outbox_blocked_campaigns(text, integer, boolean, integer, integer);

CREATE OR REPLACE FUNCTION outbox_blocked_campaigns(
    p_campaign text, p_bucket integer, p_park boolean, p_limit integer, p_waiting integer,
    p_after_at timestamptz DEFAULT NULL, p_after_campaign text DEFAULT NULL
)
    RETURNS TABLE (campaign_id text, blocking_seq bigint, status text, enqueued_at timestamptz,
                   waiting bigint, total bigint)
    LANGUAGE plpgsql STABLE
    SET search_path FROM CURRENT
    AS $$
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
            ) AND NOT EXISTS (
                -- A projector's own failure holds that projector alone (S24), not the campaign.
                SELECT 1 FROM projection_holds h
                WHERE h.bucket = b AND h.campaign_id = f.campaign_id AND h.seq = f.seq
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
        WHERE p_after_at IS NULL OR (u.at, u.c) > (p_after_at, p_after_campaign)
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
