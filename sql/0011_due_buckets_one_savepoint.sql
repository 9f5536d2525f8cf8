-- Which buckets have due work (0010), with one subtransaction for the whole read instead of
-- one per bucket. On Citus a PL/pgSQL exception block is a savepoint on every worker
-- connection the transaction holds: 0010's block per bucket sent four more commands per bucket
-- to the worker nodes (SAVEPOINT and RELEASE on each of two), 256 for 64 buckets, on every
-- read of the ring. Now the probes run under one block; only when a probe cannot reach its
-- node (connection_failure) does the read start over with a block per bucket, leaving out the
-- buckets it cannot reach. The answer is gathered before it is returned, so a read that
-- starts over returns each bucket once.

-- One bucket's earliest due time after p_after: of an unblocked campaign row, or (p_rows) of a
-- live work row. One index probe.
CREATE FUNCTION outbox_bucket_due_at(p_rows boolean, p_bucket integer, p_after timestamptz)
RETURNS timestamptz
LANGUAGE plpgsql STABLE
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
