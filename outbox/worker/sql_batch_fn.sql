-- The batch of SQL projectors in one call (`sql_batch.py`): claim, the projectors' functions
-- and the settle, server-side, for a worker whose projectors are all SQL.
-- requires: buckets/distribution_fn.sql
-- requires: queue/claim_fn.sql
-- requires: queue/settle_fn.sql
-- requires: projection/sql_projectors_fn.sql

-- A batch's claim (`outbox_claim`'s arguments, `p_ordered` its ordered projectors), read into
-- arrays in the claim's order, and checked set-wise (a row loop cost more than the functions
-- it feeds): `why` is the first reason the batch is not plain (below), or null. A generic plan
-- always (but on Citus): its custom plans cost a planning per batch (0.2 ms) and were never
-- cheaper to run.
CREATE OR REPLACE FUNCTION outbox_claim_plain(
    p_bucket integer,
    p_campaigns integer,
    p_budget integer,
    p_ordered text[],
    p_starts_now text[],
    p_known_types text[],
    p_now timestamptz,
    p_take text,
    OUT campaign_ids text[],
    OUT seqs bigint[],
    OUT event_types text[],
    OUT last_seqs bigint[],
    OUT why text
)
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    -- The projectors other worker groups serve (S35): their holds are their groups' queue,
    -- nothing this batch owes or waits for.
    others text[] := ARRAY(
        SELECT g.projector FROM outbox_projectors g WHERE g.group_name <> 'default');
BEGIN
    SELECT coalesce(array_agg(c.campaign_id ORDER BY c.ord), '{}'),
           coalesce(array_agg(c.seq ORDER BY c.ord), '{}'),
           coalesce(array_agg(c.event_type ORDER BY c.ord), '{}'),
           coalesce(array_agg(c.last_seq ORDER BY c.ord), '{}'),
           (array_agg(c.why ORDER BY c.ord) FILTER (WHERE c.why IS NOT NULL))[1]
    INTO campaign_ids, seqs, event_types, last_seqs, why
    FROM (
        SELECT x.campaign_id, x.seq, x.event_type, x.last_seq, x.ord, CASE
            WHEN x.seq IS NULL OR NOT x.due
              OR (x.holds IS NOT NULL AND EXISTS (
                  SELECT 1 FROM jsonb_array_elements(x.holds::jsonb) AS h(value)
                  WHERE NOT (h.value ->> 'projector') = ANY (others)))
              OR x.status NOT IN ('pending', 'failed') OR x.event_type IS NULL
              OR NOT x.event_type = ANY (p_known_types)
                THEN format('not a plain batch: campaign %s seq %s', x.campaign_id, x.seq)
            WHEN x.previous_campaign IS DISTINCT FROM x.campaign_id THEN CASE
                WHEN x.first_seq IS DISTINCT FROM x.seq  -- a row before its head (dead)
                    THEN format('campaign %s has rows before its head', x.campaign_id)
                ELSE (  -- each ordered checkpoint right before the campaign's first row
                    SELECT format('projector %s is at seq %s of campaign %s, not %s',
                                  o.name, o.at, x.campaign_id, x.seq - 1)
                    FROM (SELECT u.name,
                                 CASE WHEN array_position(x.projectors, u.name) IS NOT NULL
                                      THEN x.applied_seqs[array_position(x.projectors,
                                                                         u.name)]
                                      WHEN u.name = ANY (p_starts_now) THEN x.seq - 1
                                      ELSE 0 END AS at
                          FROM unnest(p_ordered) AS u(name)) o
                    WHERE o.at <> x.seq - 1
                    LIMIT 1)
                END
            WHEN x.seq <> x.previous_seq + 1
                THEN format('campaign %s has a gap before seq %s', x.campaign_id, x.seq)
        END AS why
        FROM (
            SELECT k.*, k.ordinality AS ord,  -- the claim's order
                   lag(k.campaign_id) OVER (ORDER BY k.ordinality) AS previous_campaign,
                   lag(k.seq) OVER (ORDER BY k.ordinality) AS previous_seq
            FROM outbox_claim(p_bucket, p_campaigns, p_budget, p_ordered, p_now, p_take)
             WITH ORDINALITY AS k
        ) x
    ) c;
END
$$;

-- One batch in bucket `p_bucket` (-1: across buckets, on one server), as `outbox_claim` takes
-- it (p_campaigns campaigns, p_budget rows), applied and settled in this call: in autocommit,
-- one round trip is the whole batch.
-- `p_plan` is the worker's projectors and what the settle needs:
--   projectors  [{name, function (a `schema.fn(jsonb)` signature), types, ordered, markers,
--               start}]
--   ignored     event types no projector needs (completed, counted skipped)
--   known       the projectors the batch knows (the settle's check: outbox_settle)
--   now         an instant (tests), or null: the database clock
--   take        the claim's p_take
--   channel     the applied channel the settle notifies
-- It handles the common batch alone: every claimed campaign's rows due from its head with no
-- holds and no gap, each ordered projector's checkpoint right before them (or absent for a
-- projector that starts now), every event type subscribed or ignored, and every function
-- returning. Then each projector's function gets its events as one JSON array
-- (`outbox_events_json`, read from the journal by key), every ordered checkpoint passes every
-- event, the rows are deleted and the campaign rows written by `outbox_settle`, exactly as
-- the worker's own settle would. Any
-- other batch, and any error on the way (a function raising, a refusal of the settle), undoes
-- the whole call: `handled` false and the reason, and the worker runs the batch its own way,
-- which isolates a failing event and records its failure (S6, S24).
CREATE OR REPLACE FUNCTION outbox_apply_sql_batch(
    p_bucket integer,
    p_campaigns integer,
    p_budget integer,
    p_plan jsonb,
    OUT handled boolean,
    OUT reason text,
    OUT campaigns integer,
    OUT claimed integer,
    OUT applied integer,
    OUT skipped integer,
    OUT depth_rows integer,
    OUT per_projector jsonb,
    OUT due bigint,
    OUT ages double precision[]
)
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
AS $$
DECLARE
    v_now timestamptz := (p_plan ->> 'now')::timestamptz;
    ordered text[] := ARRAY(
        SELECT p ->> 'name' FROM jsonb_array_elements(p_plan -> 'projectors') p
        WHERE (p ->> 'ordered')::boolean ORDER BY 1);
    starts_now text[] := ARRAY(
        SELECT p ->> 'name' FROM jsonb_array_elements(p_plan -> 'projectors') p
        WHERE (p ->> 'ordered')::boolean AND p ->> 'start' = 'now');
    known_types text[] := ARRAY(
        SELECT jsonb_array_elements_text(p -> 'types')
        FROM jsonb_array_elements(p_plan -> 'projectors') p
        UNION SELECT jsonb_array_elements_text(p_plan -> 'ignored'));
    ignored text[] := ARRAY(SELECT jsonb_array_elements_text(p_plan -> 'ignored'));
    p jsonb;
    cids text[];
    given_campaigns text[];
    given_seqs bigint[];
    seqs bigint[];
    types text[];
    lasts bigint[];
    writes jsonb;
    moves jsonb;
    why text;
    n integer;
    settled record;
BEGIN
    handled := false;
    campaigns := 0;
    claimed := 0;
    applied := 0;
    skipped := 0;
    depth_rows := 0;
    due := 0;
    per_projector := '{}';
    BEGIN
        -- The claim, read once into arrays and checked set-wise.
        SELECT c.campaign_ids, c.seqs, c.event_types, c.last_seqs, c.why
        INTO cids, seqs, types, lasts, why
        FROM outbox_claim_plain(p_bucket, p_campaigns, p_budget, ordered, starts_now,
                                known_types, v_now, coalesce(p_plan ->> 'take', 'all')) c;
        IF why IS NOT NULL THEN
            RAISE EXCEPTION '%', why USING ERRCODE = 'OB901';
        END IF;
        IF cardinality(seqs) = 0 THEN
            handled := true;
            RETURN;
        END IF;
        -- Each campaign's row after the batch (the worker's `campaign_writes` for a batch that
        -- completed every row it took): its head past the last row taken, due now when rows
        -- are left past it, else gone; and how deep it was (the next claim is shared by it).
        SELECT jsonb_agg(jsonb_build_object(
                   'campaign_id', c.campaign_id, 'head_seq', c.taken + 1, 'due_at', NULL,
                   'delay', CASE WHEN c.last > c.taken THEN 0.0 END, 'seen', NULL,
                   'blocked', false, 'gone', c.last <= c.taken) ORDER BY c.campaign_id),
               sum(CASE WHEN c.last > c.taken THEN 2 * c.rows ELSE c.rows END),
               count(*)
        INTO writes, depth_rows, campaigns
        FROM (SELECT x.campaign_id, max(x.seq) AS taken, max(x.last) AS last, count(*) AS rows
              FROM unnest(cids, seqs, lasts) AS x(campaign_id, seq, last)
              GROUP BY x.campaign_id) c;
        -- Each projector's function, on the events of its types.
        FOR p IN SELECT x FROM jsonb_array_elements(p_plan -> 'projectors') x LOOP
            IF (p ->> 'markers')::boolean THEN
                -- An unordered projector with markers (S18): its events whose marker is made
                -- now; an event already marked was applied (a duplicate, skipped).
                WITH reserved AS (
                    INSERT INTO processed_markers AS m (bucket, campaign_id, seq, handler)
                    SELECT outbox_bucket_in(p_bucket, x.campaign_id), x.campaign_id, x.seq,
                           p ->> 'name'
                    FROM unnest(cids, seqs, types) AS x(campaign_id, seq, type)
                    WHERE x.type IN (SELECT jsonb_array_elements_text(p -> 'types'))
                    ORDER BY x.campaign_id, x.seq
                    ON CONFLICT (bucket, campaign_id, seq, handler) DO NOTHING
                    RETURNING m.campaign_id, m.seq
                )
                SELECT array_agg(r.campaign_id ORDER BY r.campaign_id, r.seq),
                       array_agg(r.seq ORDER BY r.campaign_id, r.seq)
                INTO given_campaigns, given_seqs
                FROM reserved r;
            ELSE
                SELECT array_agg(x.campaign_id ORDER BY x.ord), array_agg(x.seq ORDER BY x.ord)
                INTO given_campaigns, given_seqs
                FROM unnest(cids, seqs, types) WITH ORDINALITY AS x(campaign_id, seq, type, ord)
                WHERE x.type IN (SELECT jsonb_array_elements_text(p -> 'types'));
            END IF;
            n := coalesce(cardinality(given_seqs), 0);
            IF n > 0 THEN
                EXECUTE outbox_function_call((p ->> 'function')::regprocedure, '$1')
                    USING outbox_upcast_events(
                        outbox_events_json(p_bucket, given_campaigns, given_seqs),
                        p -> 'upcasters');
                per_projector := per_projector || jsonb_build_object(p ->> 'name', n);
            END IF;
        END LOOP;
        SELECT count(*) FILTER (WHERE t = ANY (ignored)),
               count(*) FILTER (WHERE NOT t = ANY (ignored))
        INTO skipped, applied
        FROM unnest(types) t;
        -- Every ordered checkpoint passes every event of its campaign (S17), in lock order.
        SELECT coalesce(jsonb_agg(jsonb_build_object(
                   'campaign_id', c.campaign_id, 'projector', o.name, 'applied_seq', c.last)
                   ORDER BY c.campaign_id COLLATE "C", o.name COLLATE "C"), '[]')
        INTO moves
        FROM (SELECT x.campaign_id, max(x.seq) AS last
              FROM unnest(cids, seqs) AS x(campaign_id, seq) GROUP BY x.campaign_id) c
        CROSS JOIN unnest(ordered) AS o(name);
        SELECT s.due, s.ages INTO settled
        FROM outbox_settle(p_bucket, jsonb_build_object(
            'done', (SELECT jsonb_agg(jsonb_build_object('campaign_id', x.c, 'seq', x.s))
                     FROM unnest(cids, seqs) AS x(c, s)),
            'failed', '[]'::jsonb, 'holds', '[]'::jsonb, 'released', '[]'::jsonb,
            'touched', '[]'::jsonb, 'campaigns', writes, 'checkpoints', moves,
            'projectors', p_plan -> 'known', 'group', 'default', 'now', p_plan -> 'now',
            'notify', true,
            'channel', p_plan -> 'channel')) s;
        claimed := cardinality(seqs);
        due := settled.due;
        ages := settled.ages;
        handled := true;
    EXCEPTION WHEN OTHERS THEN
        handled := false;
        reason := SQLERRM;
        campaigns := 0;
        claimed := 0;
        applied := 0;
        skipped := 0;
        depth_rows := 0;
        due := 0;
        ages := NULL;
        per_projector := '{}';
    END;
END
$$;

-- A worker group's batch of SQL projectors in one call (S35), on one server: up to `p_limit`
-- due holds per projector claimed (`outbox_claim_holds`), each projector taken on from its
-- checkpoint (one that starts now, with none, from its hold's `from_seq`) through the journal,
-- at most `p_budget` events per hold, and settled by `outbox_settle`: a hold that reached the
-- campaign's end released with the checkpoint it left (`upto`), one that did not kept due now.
-- `p_plan` as `outbox_apply_sql_batch`'s, with `group`. It handles the common batch alone:
-- every hold pending at seq 0, no gap in the journal, every function returning; any other
-- batch, and any error on the way, undoes the whole call (`handled` false and the reason), and
-- the worker runs the batch its own way. `claimed`: the holds taken; `campaigns`: theirs.
CREATE OR REPLACE FUNCTION outbox_apply_sql_holds(
    p_limit integer,
    p_budget integer,
    p_plan jsonb,
    OUT handled boolean,
    OUT reason text,
    OUT campaigns integer,
    OUT claimed integer,
    OUT applied integer,
    OUT skipped integer,
    OUT depth_rows integer,
    OUT per_projector jsonb,
    OUT due bigint,
    OUT ages double precision[]
)
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
SET enable_seqscan = off
SET plan_cache_mode = force_generic_plan
SET jit = off
AS $$
DECLARE
    v_now timestamptz := (p_plan ->> 'now')::timestamptz;
    names text[] := ARRAY(
        SELECT p ->> 'name' FROM jsonb_array_elements(p_plan -> 'projectors') p ORDER BY 1);
    starts_now text[] := ARRAY(
        SELECT p ->> 'name' FROM jsonb_array_elements(p_plan -> 'projectors') p
        WHERE p ->> 'start' = 'now');
    held jsonb;
    read jsonb;
    tally jsonb;
    p jsonb;
    given_campaigns text[];
    given_seqs bigint[];
    n integer;
    settled record;
BEGIN
    handled := false;
    campaigns := 0;
    claimed := 0;
    applied := 0;
    skipped := 0;
    depth_rows := 0;
    due := 0;
    per_projector := '{}';
    BEGIN
        -- The holds taken, each with where its projector stands (`at`) and its checkpoint.
        SELECT coalesce(jsonb_agg(jsonb_build_object(
                   'campaign_id', c.campaign_id, 'projector', h.value ->> 'projector',
                   'seq', (h.value ->> 'seq')::bigint, 'status', h.value ->> 'status',
                   'cp', c.applied_seqs[array_position(c.projectors, h.value ->> 'projector')],
                   'at', coalesce(
                       c.applied_seqs[array_position(c.projectors, h.value ->> 'projector')],
                       CASE WHEN h.value ->> 'projector' = ANY (starts_now)
                            THEN (h.value ->> 'from')::bigint - 1 END,
                       0))), '[]')
        INTO held
        FROM outbox_claim_holds(names, p_limit, v_now) c
        CROSS JOIN LATERAL jsonb_array_elements(c.holds::jsonb) AS h(value);
        IF jsonb_array_length(held) = 0 THEN
            handled := true;
            RETURN;
        END IF;
        IF held @? '$[*] ? (@.status != "pending" || @.seq != 0)' THEN
            RAISE EXCEPTION 'a hold to retry: the worker''s own path' USING ERRCODE = 'OB901';
        END IF;
        -- What each hold owes: the journal after `at`, at most p_budget events, by key.
        SELECT coalesce(jsonb_agg(jsonb_build_object(
                   'campaign_id', h.campaign_id, 'projector', h.projector, 'seq', e.seq,
                   'type', e.event_type) ORDER BY h.campaign_id, e.seq), '[]')
        INTO read
        FROM jsonb_to_recordset(held) AS h(campaign_id text, projector text, at bigint)
        CROSS JOIN LATERAL (
            SELECT e.seq, e.event_type FROM event_journal e
            WHERE e.bucket = outbox_bucket(h.campaign_id) AND e.campaign_id = h.campaign_id
              AND e.seq > h.at
            ORDER BY e.seq
            LIMIT p_budget
        ) e;
        -- Per hold, once: the checkpoint it leaves (each passes every event read, S17), how
        -- many events it read (fewer than the budget: it reached the campaign's end), and
        -- whether they skip a seq (a gap: CheckpointGap is the worker's to record).
        SELECT coalesce(jsonb_agg(jsonb_build_object(
                   'campaign_id', h.campaign_id, 'projector', h.projector, 'cp', h.cp,
                   'upto', greatest(h.at, r.last), 'n', coalesce(r.n, 0),
                   'gap', coalesce(r.last - h.at <> r.n, false))), '[]')
        INTO tally
        FROM jsonb_to_recordset(held)
            AS h(campaign_id text, projector text, cp bigint, at bigint)
        LEFT JOIN (
            SELECT r.campaign_id, r.projector, max(r.seq) AS last, count(*) AS n
            FROM jsonb_to_recordset(read) AS r(campaign_id text, projector text, seq bigint)
            GROUP BY r.campaign_id, r.projector
        ) r USING (campaign_id, projector);
        IF tally @? '$[*] ? (@.gap == true)' THEN
            RAISE EXCEPTION 'a gap in the journal: the worker''s own path' USING ERRCODE = 'OB901';
        END IF;
        FOR p IN SELECT x FROM jsonb_array_elements(p_plan -> 'projectors') x LOOP
            SELECT array_agg(r.campaign_id ORDER BY r.campaign_id, r.seq),
                   array_agg(r.seq ORDER BY r.campaign_id, r.seq)
            INTO given_campaigns, given_seqs
            FROM jsonb_to_recordset(read) AS r(campaign_id text, projector text, seq bigint,
                                               type text)
            WHERE r.projector = p ->> 'name'
              AND r.type IN (SELECT jsonb_array_elements_text(p -> 'types'));
            n := coalesce(cardinality(given_seqs), 0);
            IF n > 0 THEN
                EXECUTE outbox_function_call((p ->> 'function')::regprocedure, '$1')
                    USING outbox_upcast_events(
                        outbox_events_json(-1, given_campaigns, given_seqs), p -> 'upcasters');
                per_projector := per_projector || jsonb_build_object(p ->> 'name', n);
                applied := applied + n;
            END IF;
        END LOOP;
        skipped := jsonb_array_length(read) - applied;
        SELECT s.due, s.ages INTO settled
        FROM outbox_settle(-1, jsonb_build_object(
            'done', '[]'::jsonb, 'failed', '[]'::jsonb, 'touched', '[]'::jsonb,
            'campaigns', '[]'::jsonb,
            'checkpoints', (  -- in lock order
                SELECT coalesce(jsonb_agg(jsonb_build_object(
                           'campaign_id', t.campaign_id, 'projector', t.projector,
                           'applied_seq', t.upto)
                           ORDER BY t.campaign_id COLLATE "C", t.projector COLLATE "C"), '[]')
                FROM jsonb_to_recordset(tally)
                    AS t(campaign_id text, projector text, cp bigint, upto bigint)
                WHERE t.cp IS DISTINCT FROM t.upto),
            -- A hold that reached the campaign's end is released with the checkpoint it left;
            -- the others stay, due now.
            'released', (
                SELECT coalesce(jsonb_agg(jsonb_build_object(
                           'campaign_id', t.campaign_id, 'projector', t.projector, 'seq', 0,
                           'upto', t.upto)), '[]')
                FROM jsonb_to_recordset(tally)
                    AS t(campaign_id text, projector text, upto bigint, n integer)
                WHERE t.n < p_budget),
            'holds', (
                SELECT coalesce(jsonb_agg(jsonb_build_object(
                           'campaign_id', t.campaign_id, 'projector', t.projector, 'seq', 0,
                           'status', 'pending', 'attempts', 0, 'delay', 0.0)), '[]')
                FROM jsonb_to_recordset(tally)
                    AS t(campaign_id text, projector text, n integer)
                WHERE t.n >= p_budget),
            'projectors', p_plan -> 'known', 'group', p_plan -> 'group', 'now', p_plan -> 'now',
            'notify', false)) s;
        claimed := jsonb_array_length(held);
        campaigns := (SELECT count(DISTINCT h.value ->> 'campaign_id')
                      FROM jsonb_array_elements(held) AS h(value));
        due := settled.due + jsonb_array_length(jsonb_path_query_array(
            tally, '$[*] ? (@.n >= $budget)', jsonb_build_object('budget', p_budget)));
        handled := true;
    EXCEPTION WHEN OTHERS THEN
        handled := false;
        reason := SQLERRM;
        campaigns := 0;
        claimed := 0;
        applied := 0;
        skipped := 0;
        due := 0;
        ages := NULL;
        per_projector := '{}';
    END;
END
$$;

-- Back to the default plans on Citus (buckets/distribution_fn.sql).
SELECT outbox_plans_for_citus();
