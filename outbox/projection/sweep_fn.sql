-- The catch-up sweep's server function (`sweep.py`, S25): a projector that starts at the
-- beginning reaches every campaign of the journal, dormant ones too.
-- requires: projection/build_fn.sql

-- Catch-up holds (S24: seq 0, pending, due now) of projector `p_projector` on campaigns
-- `p_campaigns` (each in its bucket of `p_buckets`), and a campaign row due now for each that
-- has none (one it has already is left as it is: the campaign is claimed when it comes due,
-- the hold with it): a worker's batch takes the projector on from its checkpoint through the
-- journal. The sweep seeds them (below), and the engine for a campaign it left where its
-- checkpoint stands (a failing event, build.py), so the workers' holds count its attempts.
-- The workers are woken when any was placed. Returns the holds placed.
CREATE OR REPLACE FUNCTION outbox_hold_catch_ups(
    p_projector text,
    p_buckets integer[],
    p_campaigns text[]
)
RETURNS integer
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
SET jit = off
AS $$
DECLARE
    placed integer;
    lock_b integer;
    lock_cs text[];
    v_now timestamptz := statement_timestamp();
BEGIN
    INSERT INTO projection_holds AS y
        (bucket, campaign_id, projector, seq, status, attempt_count, next_attempt_at,
         created_at, updated_at)
    SELECT t.bucket, t.campaign_id, p_projector, 0, 'pending', 0, v_now, v_now, v_now
    FROM unnest(p_buckets, p_campaigns) AS t(bucket, campaign_id)
    ORDER BY t.bucket, t.campaign_id
    ON CONFLICT DO NOTHING;
    GET DIAGNOSTICS placed = ROW_COUNT;
    -- A campaign row for each that has none, made only under the campaign's append head
    -- (S26): one an append holds now is skipped (the append queues the campaign itself), and
    -- the look for an existing row comes after the heads are held. Bucket by bucket: Citus
    -- locks rows only in a statement that names one.
    FOR lock_b IN SELECT DISTINCT x.b FROM unnest(p_buckets) AS x(b) ORDER BY 1 LOOP
        lock_cs := ARRAY(
            SELECT h.campaign_id FROM campaign_head_keys h
            WHERE h.bucket = lock_b AND h.campaign_id = ANY (p_campaigns)
            ORDER BY h.campaign_id
            FOR NO KEY UPDATE SKIP LOCKED
        );
        INSERT INTO projection_apply_campaigns
            (bucket, campaign_id, head_seq, due_at, updated_at, slot)
        SELECT lock_b, t.campaign_id, 0, v_now, v_now, outbox_queue_slot(v_now)
        FROM unnest(lock_cs) AS t(campaign_id)
        WHERE NOT EXISTS (
            SELECT 1 FROM projection_apply_campaigns c
            WHERE c.bucket = lock_b AND c.campaign_id = t.campaign_id
        )
        ORDER BY t.campaign_id;
    END LOOP;
    IF placed > 0 THEN
        PERFORM pg_notify(current_schema() || '.outbox_work', '');
    END IF;
    RETURN placed;
END
$$;

-- One step of projector `p_projector`'s sweep: the next `p_campaigns` campaigns of
-- `campaign_heads` after its cursor, in key order, each that holds an event of its types and
-- that it is behind on (its checkpoint below the head, no hold of its own there, and, for an
-- ordered projector, no work rows: their claim heals it from the journal; an unordered one's
-- catch-up covers them, its markers skipping what the rows gave it) given a catch-up hold (seq 0, pending, due now) and a campaign row due now (one it
-- has already is left as it is: the campaign is claimed when it comes due, the hold with it). The cursor moves past them; past the
-- last campaign the sweep is done (`swept_at`). Nothing is seeded while the projector has
-- `p_outstanding` catch-up holds or more not yet dead: the sweep keeps pace with the worker,
-- and the holds table stays small however long the journal. One worker steps a sweep at a
-- time (the record's row lock, skipped by the others). Returns the holds placed, the campaigns
-- looked at and whether the sweep is done (false while another worker steps it).
CREATE OR REPLACE FUNCTION outbox_sweep(
    p_projector text,
    p_campaigns integer,
    p_outstanding integer
)
RETURNS TABLE (seeded integer, reached integer, swept boolean)
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
SET jit = off
AS $$
DECLARE
    cursor_bucket integer;
    cursor_campaign text;
    v_ordered boolean;
    v_events text[];
    waiting integer;
    bs integer[];
    cs text[];
    heads bigint[];
    skip text[];
    v_reached integer;
    placed integer;
BEGIN
    SELECT p.sweep_bucket, p.sweep_campaign, p.ordered, p.events
    INTO cursor_bucket, cursor_campaign, v_ordered, v_events
    FROM outbox_projectors p
    JOIN outbox_projector_versions v ON v.projector = p.projector
    WHERE p.projector = p_projector AND p.swept_at IS NULL
      AND v.state <> 'superseded'  -- a superseded version is owed nothing (S29): no sweep
    FOR UPDATE OF p SKIP LOCKED;
    IF NOT FOUND THEN
        RETURN QUERY
        SELECT 0, 0, coalesce(
            (SELECT v.state = 'superseded' OR p.swept_at IS NOT NULL
             FROM outbox_projectors p
             JOIN outbox_projector_versions v ON v.projector = p.projector
             WHERE p.projector = p_projector),
            true);
        RETURN;
    END IF;
    IF NOT pg_try_advisory_xact_lock_shared(outbox_build_key(p_projector), -1) THEN
        -- A build of it runs (S30): it catches up the campaigns itself; nothing is seeded.
        RETURN QUERY SELECT 0, 0, false;
        RETURN;
    END IF;
    SELECT count(*) INTO waiting
    FROM projection_holds h
    WHERE h.projector = p_projector AND h.status <> 'dead' AND h.seq = 0;
    IF waiting >= p_outstanding THEN
        RETURN QUERY SELECT 0, 0, false;
        RETURN;
    END IF;
    -- Statements on arrays, not one statement of CTEs: Citus plans each of these alone.
    SELECT coalesce(array_agg(n.bucket ORDER BY n.bucket, n.campaign_id), '{}'),
           coalesce(array_agg(n.campaign_id ORDER BY n.bucket, n.campaign_id), '{}'),
           coalesce(array_agg(n.last_seq ORDER BY n.bucket, n.campaign_id), '{}')
    INTO bs, cs, heads
    FROM (
        SELECT h.bucket, h.campaign_id, h.last_seq
        FROM campaign_heads h
        WHERE cursor_bucket IS NULL
           OR (h.bucket, h.campaign_id) > (cursor_bucket, cursor_campaign)
        ORDER BY h.bucket, h.campaign_id
        LIMIT p_campaigns
    ) n;
    v_reached := cardinality(cs);
    -- Nor a campaign that holds none of its types: it owes nothing there (its lag counts its
    -- own types only), and a hold would cost a batch for nothing. A later event of the
    -- campaign heals an ordered projector from the journal as it comes (S17). One read of the
    -- step's campaigns, by key.
    SELECT coalesce(array_agg(x.campaign_id), '{}') INTO skip
    FROM (
        SELECT t.campaign_id FROM unnest(cs) AS t(campaign_id)
        EXCEPT
        SELECT e.campaign_id FROM event_journal e
        WHERE e.bucket = ANY (bs) AND e.campaign_id = ANY (cs) AND e.event_type = ANY (v_events)
    ) x;
    -- Not behind: at the head already, or a hold of its own there (for an unordered
    -- projector, its catch-up hold: a hold on one event, a failure met before the sweep came,
    -- leaves the campaign's other history owed, which the catch-up gives it, skipping the
    -- held event). Nor, for an ordered projector, a campaign with work rows: their claim
    -- heals it from the journal (S24).
    SELECT skip || coalesce(array_agg(x.campaign_id), '{}') INTO skip
    FROM (
        SELECT k.campaign_id FROM projection_checkpoints k
        JOIN unnest(cs, heads) AS t(campaign_id, head) ON t.campaign_id = k.campaign_id
        WHERE k.bucket = ANY (bs) AND k.campaign_id = ANY (cs) AND k.projector = p_projector
          AND k.applied_seq >= t.head
        UNION ALL
        SELECT y.campaign_id FROM projection_holds y
        WHERE y.bucket = ANY (bs) AND y.campaign_id = ANY (cs) AND y.projector = p_projector
          AND (v_ordered OR y.seq = 0)
        UNION ALL
        SELECT DISTINCT o.campaign_id FROM projection_apply_outbox o
        WHERE v_ordered AND o.bucket = ANY (bs) AND o.campaign_id = ANY (cs)
    ) x;
    placed := outbox_hold_catch_ups(
        p_projector,
        ARRAY(SELECT t.b FROM unnest(bs, cs) AS t(b, c) WHERE NOT t.c = ANY (skip)),
        ARRAY(SELECT t.c FROM unnest(bs, cs) AS t(b, c) WHERE NOT t.c = ANY (skip)));
    UPDATE outbox_projectors p
    SET sweep_bucket = coalesce(bs[v_reached], p.sweep_bucket),
        sweep_campaign = coalesce(cs[v_reached], p.sweep_campaign),
        swept_at = CASE WHEN v_reached < p_campaigns THEN clock_timestamp() END
    WHERE p.projector = p_projector;
    RETURN QUERY SELECT placed, v_reached, v_reached < p_campaigns;
END
$$;
