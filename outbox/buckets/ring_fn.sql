-- Which buckets have work, and from when (`buckets.py`, the worker's ring): per bucket, the
-- earliest due time after p_after ('-infinity': any) of an unblocked campaign row, or of a live
-- work row with p_rows (ordering `none`). One index probe per bucket (the claim indexes lead
-- with the bucket), so the cost is the number of buckets, not the queue; buckets with nothing
-- return no row. What a worker's claim loop moves over, refreshed at most once per poll
-- interval.
--
-- The probes run under one exception block. On Citus a PL/pgSQL exception block is a savepoint
-- on every worker connection the transaction holds: a block per bucket sent four more commands
-- per bucket to the worker nodes (SAVEPOINT and RELEASE on each of two), 256 for 64 buckets, on
-- every read of the ring (318 remote commands and 29.0 ms per read, against 70 and 14.6 ms).
-- Only when a probe cannot reach its node (connection_failure) does the read start over with a
-- block per bucket, leaving out the buckets it cannot reach, so workers keep claiming in the
-- buckets of the nodes that are up; the next read asks again. The answer is gathered before it
-- is returned, so a read that starts over returns each bucket once. On plain PostgreSQL no
-- probe fails this way.

-- One bucket's earliest due time after p_after: of an unblocked campaign row, or (p_rows) of a
-- live work row. One index probe.
CREATE OR REPLACE FUNCTION outbox_bucket_due_at(p_rows boolean, p_bucket integer, p_after timestamptz)
RETURNS timestamptz
LANGUAGE plpgsql STABLE
SET search_path FROM CURRENT
AS $$
DECLARE
    at timestamptz;
BEGIN
    IF p_rows THEN
        SELECT min(o.next_attempt_at) INTO at FROM projection_apply_outbox o
        WHERE o.bucket = p_bucket AND o.status IN ('pending', 'failed')
          AND o.next_attempt_at > p_after;
    ELSE
        SELECT min(c.due_at) INTO at FROM projection_apply_campaigns c
        WHERE c.bucket = p_bucket AND NOT c.blocked AND c.due_at > p_after;
    END IF;
    RETURN at;
END
$$;

CREATE OR REPLACE FUNCTION outbox_due_buckets(p_rows boolean, p_after timestamptz)
RETURNS TABLE (bucket integer, due_at timestamptz)
LANGUAGE plpgsql STABLE
SET search_path FROM CURRENT
AS $$
#variable_conflict use_column
DECLARE
    b integer;
    at timestamptz;
    buckets integer[] := '{}';
    dues timestamptz[] := '{}';
BEGIN
    BEGIN
        FOR b IN 0 .. outbox_bucket_count() - 1 LOOP
            at := outbox_bucket_due_at(p_rows, b, p_after);
            IF at IS NOT NULL THEN
                buckets := buckets || b;
                dues := dues || at;
            END IF;
        END LOOP;
    EXCEPTION WHEN connection_failure THEN  -- a node is down: ask bucket by bucket
        buckets := '{}';
        dues := '{}';
        FOR b IN 0 .. outbox_bucket_count() - 1 LOOP
            BEGIN
                at := outbox_bucket_due_at(p_rows, b, p_after);
            EXCEPTION WHEN connection_failure THEN
                at := NULL;
            END;
            IF at IS NOT NULL THEN
                buckets := buckets || b;
                dues := dues || at;
            END IF;
        END LOOP;
    END;
    RETURN QUERY SELECT d.b, d.at FROM unnest(buckets, dues) AS d(b, at);
END
$$;
