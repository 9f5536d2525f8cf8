-- The holds' server function (`holds.py`): a work row's columns worked out from its holds
-- (S24), for every path that changes holds (the settle, requeues, discards).
-- requires: buckets/distribution_fn.sql

-- The rows (p_campaigns[i], p_seqs[i]) of bucket `p_bucket` (-1: each in its own) that have holds
-- take their columns from them: `failed` while a holder will try again, `pending` while they only
-- wait (a requeue, a pause), `dead` once every holder is dead; attempts the most any holder made,
-- the next attempt the earliest of the holders still trying, `last_error` the latest. Rows with no
-- hold left are not touched, nor a leased row (`processing`: its lease's end works its columns
-- out). p_now: the instant written as updated_at.
CREATE OR REPLACE FUNCTION outbox_hold_rows(
    p_bucket integer,
    p_campaigns text[],
    p_seqs bigint[],
    p_now timestamptz
) RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
SET enable_seqscan = off
SET plan_cache_mode = force_generic_plan
SET jit = off
AS $$
BEGIN
    UPDATE projection_apply_outbox o
    SET status = s.status, attempt_count = s.attempts, next_attempt_at = s.next,
        last_error = coalesce(s.error, o.last_error), updated_at = p_now
    FROM (
        SELECT h.campaign_id, h.seq,
               CASE WHEN bool_and(h.status = 'dead') THEN 'dead'
                    WHEN bool_or(h.status = 'failed') THEN 'failed'
                    ELSE 'pending' END AS status,
               max(h.attempt_count) AS attempts,
               coalesce(min(h.next_attempt_at) FILTER (WHERE h.status <> 'dead'),
                        max(h.next_attempt_at)) AS next,
               (array_agg(h.last_error ORDER BY h.updated_at DESC)
                   FILTER (WHERE h.last_error IS NOT NULL))[1] AS error
        FROM unnest(p_campaigns, p_seqs) AS t(campaign_id, seq)
        JOIN projection_holds h
            ON h.bucket = outbox_bucket_in(p_bucket, t.campaign_id)
           AND h.campaign_id = t.campaign_id AND h.seq = t.seq
        GROUP BY h.campaign_id, h.seq
    ) s
    WHERE o.bucket = outbox_bucket_in(p_bucket, s.campaign_id) AND o.campaign_id = s.campaign_id
      AND o.seq = s.seq
      AND o.status <> 'processing';
END
$$;

-- Back to the default plans on Citus (buckets/distribution_fn.sql).
SELECT outbox_plans_for_citus();
