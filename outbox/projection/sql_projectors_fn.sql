-- SQL projectors' server functions (`sql_projectors.py`): a projector that is a PostgreSQL
-- function of the application's, `fn(events jsonb)`, called with its events as one JSON array
-- of {campaign_id, seq, type, payload, metadata, recorded_at} in (campaign_id, seq) order, read
-- from the journal here (the caller sends keys, never payloads). Its reset hook is
-- `reset(campaign_id text)`, its drop hook `drop()`. Each runs in the caller's transaction
-- with the outbox's search_path (`outbox, pg_temp`): the application's function names its
-- tables with their schema, or sets its own search_path.

-- requires: buckets/distribution_fn.sql

-- A function's call, named by its schema and name as identifiers, whatever the caller's path.
CREATE OR REPLACE FUNCTION outbox_function_call(p_function regprocedure, p_arguments text)
RETURNS text
LANGUAGE plpgsql STABLE
SET search_path FROM CURRENT
AS $$
BEGIN
    RETURN (SELECT format('SELECT %I.%I(%s)', n.nspname, p.proname, p_arguments)
            FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
            WHERE p.oid = p_function);
END
$$;

-- The events at keys (p_campaign_ids[i], p_seqs[i]), all in bucket `p_bucket` (-1: each in its
-- own, a batch across buckets on one server), in the keys' order, as one JSON array. (The
-- bucket a constant: on Citus the read is routed to its shard.)
CREATE OR REPLACE FUNCTION outbox_events_json(
    p_bucket integer, p_campaign_ids text[], p_seqs bigint[]
)
RETURNS jsonb
LANGUAGE plpgsql STABLE
SET search_path FROM CURRENT
-- A probe per key, planned once per session: custom plans made each call cost more than the
-- read (0.36 ms a call at 500 events/s, pg_stat_statements).
SET enable_seqscan = off
SET plan_cache_mode = force_generic_plan
AS $$
BEGIN
    RETURN (SELECT coalesce(jsonb_agg(jsonb_build_object(
                       'campaign_id', j.campaign_id, 'seq', j.seq, 'type', j.event_type,
                       'payload', j.payload, 'metadata', j.metadata,
                       'recorded_at', j.recorded_at, 'version', j.version) ORDER BY k.ord),
                   '[]'::jsonb)
            FROM unnest(p_campaign_ids, p_seqs) WITH ORDINALITY AS k(campaign_id, seq, ord)
            JOIN event_journal j
                ON j.bucket = outbox_bucket_in(p_bucket, k.campaign_id)
               AND j.campaign_id = k.campaign_id AND j.seq = k.seq);
END
$$;

-- Events (as `outbox_events_json` makes them) each at the newest version the SQL upcasters
-- `p_upcasters` reach ({type: {from version: function}}, each function `jsonb -> jsonb`, the
-- payload of one version made into the next's): the same array when none is behind. Set-wise:
-- one statement per step of a chain (its events upcast together), in version order, so an
-- event goes through every step after its own. An upcaster that raises fails the call naming
-- it, with its SQLSTATE (the worker's halving then fails the event alone, S6; issue 62).
CREATE OR REPLACE FUNCTION outbox_upcast_events(p_events jsonb, p_upcasters jsonb)
RETURNS jsonb
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
AS $$
DECLARE
    events jsonb := p_events;
    step record;
BEGIN
    IF p_upcasters IS NULL OR NOT EXISTS (
        SELECT 1 FROM jsonb_array_elements(p_events) x
        WHERE p_upcasters -> (x ->> 'type') ? (x ->> 'version')
    ) THEN
        RETURN p_events;
    END IF;
    FOR step IN
        SELECT t.key AS event_type, v.key::integer AS version, v.value #>> '{}' AS fn,
               (SELECT format('%I.%I', n.nspname, p.proname)
                FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
                WHERE p.oid = to_regprocedure((v.value #>> '{}') || '(jsonb)')) AS called
        FROM jsonb_each(p_upcasters) t, jsonb_each(t.value) v
        ORDER BY t.key, v.key::integer
    LOOP
        BEGIN
            EXECUTE format(
                'SELECT jsonb_agg(CASE WHEN x.e ->> ''type'' = $2 '
                '                       AND (x.e ->> ''version'')::integer = $3 '
                '                  THEN x.e || jsonb_build_object(''payload'', %s(x.e -> ''payload''), '
                '                                                 ''version'', $3 + 1) '
                '                  ELSE x.e END ORDER BY x.ord) '
                'FROM jsonb_array_elements($1) WITH ORDINALITY AS x(e, ord)', step.called)
                INTO events USING events, step.event_type, step.version;
        EXCEPTION WHEN OTHERS THEN
            RAISE EXCEPTION 'upcaster % (% v% -> v%) failed: %', step.fn, step.event_type,
                step.version, step.version + 1, SQLERRM
                USING ERRCODE = SQLSTATE;
        END;
    END LOOP;
    RETURN events;
END
$$;

-- Run SQL projector `p_function` (an `fn(jsonb)`) on the events at the keys given: one
-- bucket's (a batch's on Citus, a build step's, a campaign's), or, on one server, a batch's
-- across buckets; each event upcast by `p_upcasters` first (`outbox_upcast_events`; null:
-- none). (The release before took no upcasters: that signature goes.)
DROP FUNCTION IF EXISTS outbox_run_sql_projector(regprocedure, text[], bigint[]);
CREATE OR REPLACE FUNCTION outbox_run_sql_projector(
    p_function regprocedure, p_campaign_ids text[], p_seqs bigint[],
    p_upcasters jsonb DEFAULT NULL
)
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
AS $$
DECLARE
    v_bucket integer := outbox_bucket(p_campaign_ids[1]);
    events jsonb;
BEGIN
    IF EXISTS (SELECT 1 FROM unnest(p_campaign_ids) c WHERE outbox_bucket(c) <> v_bucket) THEN
        v_bucket := -1;  -- each event read in its own bucket (`outbox_bucket_in`)
    END IF;
    events := outbox_events_json(v_bucket, p_campaign_ids, p_seqs);
    IF jsonb_array_length(events) <> coalesce(cardinality(p_seqs), 0) THEN
        RAISE EXCEPTION 'the journal lacks % of the % events given',
            coalesce(cardinality(p_seqs), 0) - jsonb_array_length(events),
            coalesce(cardinality(p_seqs), 0);
    END IF;
    EXECUTE outbox_function_call(p_function, '$1')
        USING outbox_upcast_events(events, p_upcasters);
END
$$;

-- Run a SQL projector's reset hook `p_function` (an `fn(text)`) on campaign `p_campaign_id`,
-- or its drop hook (an `fn()`) when `p_campaign_id` is NULL.
CREATE OR REPLACE FUNCTION outbox_run_sql_hook(p_function regprocedure, p_campaign_id text)
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
AS $$
BEGIN
    IF p_campaign_id IS NULL THEN
        EXECUTE outbox_function_call(p_function, '');
    ELSE
        EXECUTE outbox_function_call(p_function, '$1') USING p_campaign_id;
    END IF;
END
$$;

-- Back to the default plans on Citus (buckets/distribution_fn.sql).
SELECT outbox_plans_for_citus();
