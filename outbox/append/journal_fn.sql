-- The journal's reads by event type (`journal.py`): a projector's own events of campaigns'
-- ranges, read by the journal's type index (`event_journal_type_idx`, migration 0018), and how
-- many of them each range holds. Each is planned at every call for its arguments
-- (force_custom_plan): a plan made without them cannot tell how few of the journal's events
-- the types are, and reads every position of the ranges by the key instead (bench/sparse.py:
-- 15.8 ms against 0.65 ms for a step of 156 campaigns), and a long-lived session's statement
-- goes to such a plan after five calls. The projector's own statements, in the same
-- transaction, keep the session's plans.
-- requires: buckets/distribution_fn.sql

-- Campaign `p_campaigns[i]`'s events of types `p_types` from seq `p_firsts[i]` to `p_lasts[i]`,
-- in campaign and seq order, as `load_ranges` reads every type (payload and metadata as text).
-- `p_bucket`: the bucket all the campaigns are in (-1: each its own, on one server).
CREATE OR REPLACE FUNCTION outbox_typed_events(
    p_bucket integer,
    p_campaigns text[],
    p_firsts bigint[],
    p_lasts bigint[],
    p_types text[]
)
RETURNS TABLE (campaign_id text, seq bigint, event_type text, payload text, metadata text,
               recorded_at timestamptz, version integer)
LANGUAGE plpgsql STABLE
SET search_path FROM CURRENT
SET plan_cache_mode = force_custom_plan
SET jit = off
AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    SELECT j.campaign_id, j.seq, j.event_type, j.payload::text, j.metadata::text, j.recorded_at,
           j.version
    FROM unnest(p_campaigns, p_firsts, p_lasts) AS r(campaign_id, lo, hi)
    JOIN event_journal j
        ON j.bucket = outbox_bucket_in(p_bucket, r.campaign_id)
       AND j.event_type = ANY (p_types)
       AND j.campaign_id = r.campaign_id AND j.seq BETWEEN r.lo AND r.hi
    ORDER BY j.campaign_id, j.seq;
END
$$;

-- How many events of types `p_types` each range of `outbox_typed_events` holds (a campaign
-- with none left out), from the type index alone.
CREATE OR REPLACE FUNCTION outbox_typed_counts(
    p_bucket integer,
    p_campaigns text[],
    p_firsts bigint[],
    p_lasts bigint[],
    p_types text[]
)
RETURNS TABLE (campaign_id text, events bigint)
LANGUAGE plpgsql STABLE
SET search_path FROM CURRENT
SET plan_cache_mode = force_custom_plan
SET jit = off
AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    SELECT j.campaign_id, count(*)
    FROM unnest(p_campaigns, p_firsts, p_lasts) AS r(campaign_id, lo, hi)
    JOIN event_journal j
        ON j.bucket = outbox_bucket_in(p_bucket, r.campaign_id)
       AND j.event_type = ANY (p_types)
       AND j.campaign_id = r.campaign_id AND j.seq BETWEEN r.lo AND r.hi
    GROUP BY j.campaign_id;
END
$$;
