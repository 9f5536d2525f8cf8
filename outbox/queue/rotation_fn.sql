-- The queue's generations (`rotation.py`, S26, S27): the rotation that empties the oldest slot
-- of the work rows, the campaign rows and the checkpoints' moves whole.
--
-- Time is cut into periods of ten seconds; period n's new rows go to slot n mod 3
-- (`outbox_queue_slot`, which migration 0008 defines: the tables' default calls it). During
-- period n, slot n+1 mod 3 holds what was written two periods ago and nothing new (only a
-- statement whose clock reading is older than ten seconds still writes there), so the
-- rotation empties it then: its live rows (work still queued: a backlog, a backoff, a blocked
-- head, a dead row, a lease) move to the current slot, and TRUNCATE gives its space back,
-- dead versions and index entries included, which no vacuum may remove while a snapshot older
-- than them is held. By period n+1, when slot n+1 mod 3 becomes current, it starts empty.
-- requires: buckets/distribution_fn.sql

-- One rotation: empty the slot after the current one (the oldest) of the three tables, unless it
-- is empty already ('empty'), its locks are not had within `p_lock_timeout_ms` ('busy': a
-- reader or a batch holds them; nothing waits behind the rotation for longer than that), or
-- more than `p_limit` of its rows are live ('backlog': moving them would cost more than the
-- dead versions it frees; a later period tries again, and vacuum does its part meanwhile; the
-- checkpoints' moves are rotated all the same). Otherwise ('rotated') its rows move to the
-- current slot (of the moves, each key's newest) and it is truncated, in the
-- caller's transaction, which holds the emptied slot's locks until it commits: the caller
-- commits at once. Statements that read the queue lock every slot before they take their
-- snapshot, so none of them sees a slot emptied without seeing the rows it moved. (A work
-- row and its campaign's row may sit in different slots: nothing reads them by slot.)
-- One rotation runs at a time per install (a transaction-level advisory lock; another finds
-- it 'busy'). `p_lock_timeout_ms` is set for the rest of the caller's transaction. `p_now`:
-- tests move time with it; null is the clock. SECURITY DEFINER (its path pinned): a slot is
-- locked and truncated by name, which takes privileges on the partition itself, and a worker's
-- role has them on the parent tables alone (docs/operations.md); it does nothing a caller
-- could choose but time it.

CREATE OR REPLACE FUNCTION outbox_rotate(
    p_limit integer,
    p_lock_timeout_ms integer,
    p_now timestamptz DEFAULT NULL
)
RETURNS TABLE (slot smallint, outcome text, moved bigint)
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := coalesce(p_now, clock_timestamp());
    v_current smallint := outbox_queue_slot(v_now);
    v_old smallint := (outbox_queue_slot(v_now) + 1) % 3;
    campaigns text := format('%I.%I', current_schema(), 'projection_apply_campaigns_' || v_old);
    rows text := format('%I.%I', current_schema(), 'projection_apply_outbox_' || v_old);
    moves text := format('%I.%I', current_schema(), 'projection_checkpoint_moves_' || v_old);
    distributed boolean := outbox_distributed('projection_checkpoint_moves');
    live bigint;
    n bigint;
    m bigint;
    c bigint;
    carry text := format(
        'INSERT INTO projection_checkpoint_moves '
        '    (bucket, campaign_id, projector, n, applied_seq, moved_at, slot) '
        'SELECT DISTINCT ON (bucket, campaign_id, projector) '
        '       bucket, campaign_id, projector, n, applied_seq, moved_at, %s '
        'FROM projection_checkpoint_moves WHERE slot = %s '
        'ORDER BY bucket, campaign_id, projector, n DESC',
        v_current, v_old);
BEGIN
    IF NOT distributed AND pg_relation_size(campaigns::regclass) = 0
       AND pg_relation_size(rows::regclass) = 0 AND pg_relation_size(moves::regclass) = 0 THEN
        RETURN QUERY SELECT v_old, 'empty'::text, 0::bigint;
        RETURN;
    END IF;
    IF NOT pg_try_advisory_xact_lock(hashtext(current_schema() || '.outbox_rotate')) THEN
        RETURN QUERY SELECT v_old, 'busy'::text, 0::bigint;
        RETURN;
    END IF;
    IF distributed THEN
        -- On Citus the rows are in the shards: the coordinator's partitions are empty, and
        -- neither this lock_timeout nor a LOCK reaches the shards, where a TRUNCATE would queue
        -- behind any open batch. The work rows and campaign rows are left to vacuum there
        -- (docs/scaling.md); the checkpoints' moves, which nothing else deletes, are carried
        -- and then deleted: one transaction, so every snapshot sees each key's newest move.
        EXECUTE carry;
        GET DIAGNOSTICS c = ROW_COUNT;
        EXECUTE format('DELETE FROM projection_checkpoint_moves WHERE slot = %s', v_old);
        RETURN QUERY SELECT v_old, CASE WHEN c = 0 THEN 'empty' ELSE 'rotated' END, c;
        RETURN;
    END IF;
    PERFORM set_config('lock_timeout', p_lock_timeout_ms || 'ms', true);
    BEGIN
        -- A wait on any lock is bounded by the timeout: no deadlock with a reader lasts.
        EXECUTE format('LOCK TABLE ONLY %s, %s, %s IN ACCESS EXCLUSIVE MODE',
                       campaigns, rows, moves);
    EXCEPTION WHEN lock_not_available THEN
        RETURN QUERY SELECT v_old, 'busy'::text, 0::bigint;
        RETURN;
    END;
    -- The checkpoints first, whatever the queue's backlog: each key's newest move of the slot
    -- is carried into the current one (its number kept, so a newer move stays newest), and
    -- nothing else of the slot is ever read again.
    EXECUTE carry;
    GET DIAGNOSTICS c = ROW_COUNT;
    EXECUTE format('TRUNCATE ONLY %s', moves);
    IF pg_relation_size(campaigns::regclass) = 0 AND pg_relation_size(rows::regclass) = 0 THEN
        RETURN QUERY SELECT v_old, 'rotated'::text, c;
        RETURN;
    END IF;
    EXECUTE format(
        'SELECT (SELECT count(*) FROM (SELECT 1 FROM ONLY %s LIMIT $1) x) '
        '     + (SELECT count(*) FROM (SELECT 1 FROM ONLY %s LIMIT $1) y)',
        campaigns, rows)
        INTO live USING p_limit + 1;
    IF live > p_limit THEN
        RETURN QUERY SELECT v_old, 'backlog'::text, live;
        RETURN;
    END IF;
    -- Row movement: an update of the slot moves each row to the current slot's partition,
    -- every other column as it was (the slots as literals: planned on the old one alone).
    EXECUTE format('UPDATE projection_apply_campaigns SET slot = %s WHERE slot = %s',
                   v_current, v_old);
    GET DIAGNOSTICS n = ROW_COUNT;
    EXECUTE format('UPDATE projection_apply_outbox SET slot = %s WHERE slot = %s',
                   v_current, v_old);
    GET DIAGNOSTICS m = ROW_COUNT;
    EXECUTE format('TRUNCATE ONLY %s, %s', campaigns, rows);
    RETURN QUERY SELECT v_old, 'rotated'::text, n + m + c;
END
$$;
