-- Checkpoints insert-only (issue 38): an ordered projector's checkpoint was one row per
-- (campaign, projector), updated by every batch. Under a snapshot held elsewhere each update
-- left a version vacuum may not remove, and every probe of the key (the claim's lock, the
-- settle's move) walked all of them: 180,000 in fifteen minutes at 200 events/s, 360 per
-- campaign, most of what the queue's tables grew by (docs/performance.md).
--
-- Now the row is the checkpoint's key alone, `projection_checkpoint_keys`: made once, locked
-- by whoever applies the campaign (a row lock writes no version), never updated. Each move is
-- a new row of `projection_checkpoint_moves`, numbered per key (`n`, one past the key's last),
-- in the queue's slots (`outbox_queue_slot`); the checkpoint is its newest move, or the key's
-- own value when it has none. The rotation (`outbox_rotate`) carries each key's newest move
-- of the oldest slot into the current one and truncates that slot, so the moves take three
-- periods of space and a probe reads one entry per slot, however long a snapshot is held.
-- `projection_checkpoints` is now a view of the current values, for every reader.
-- (docs/semantics.md, S27.)

ALTER TABLE projection_checkpoints RENAME TO projection_checkpoint_keys;
ALTER INDEX projection_checkpoints_pkey RENAME TO projection_checkpoint_keys_pkey;
ALTER INDEX projection_checkpoints_projector_idx RENAME TO projection_checkpoint_keys_projector_idx;
ALTER TABLE projection_checkpoint_keys
    RENAME CONSTRAINT projection_checkpoints_bucket_check TO projection_checkpoint_keys_bucket_check;
ALTER TABLE projection_checkpoint_keys
    RENAME CONSTRAINT projection_checkpoints_applied_seq_check
    TO projection_checkpoint_keys_applied_seq_check;
-- Never updated now: no room kept for updates, and autovacuum's defaults.
ALTER TABLE projection_checkpoint_keys
    SET (fillfactor = 100),
    RESET (autovacuum_vacuum_scale_factor, autovacuum_vacuum_cost_delay);

CREATE TABLE projection_checkpoint_moves (
    bucket      integer     NOT NULL,
    campaign_id text        NOT NULL,
    projector   text        NOT NULL,
    n           bigint      NOT NULL CONSTRAINT projection_checkpoint_moves_n_check CHECK (n >= 1),
    applied_seq bigint      NOT NULL
        CONSTRAINT projection_checkpoint_moves_applied_seq_check CHECK (applied_seq >= 0),
    moved_at    timestamptz NOT NULL DEFAULT clock_timestamp(),
    slot        smallint    NOT NULL DEFAULT outbox_queue_slot(clock_timestamp()),
    -- The key's newest move is the first entry of a backward scan, in each slot.
    PRIMARY KEY (bucket, campaign_id, projector, n, slot)
) PARTITION BY LIST (slot);

DO $$
BEGIN
    FOR s IN 0 .. 2 LOOP
        EXECUTE format('CREATE TABLE %I PARTITION OF projection_checkpoint_moves '
                       'FOR VALUES IN (%s)', 'projection_checkpoint_moves_' || s, s);
    END LOOP;
END
$$;

-- The current value of every checkpoint, as the table read before: the key's newest move,
-- else its own value. (DISTINCT ON rather than a LATERAL probe, so that Citus can run a read
-- across buckets on the shards; a read that names the bucket and campaign is planned as
-- probes.)
CREATE VIEW projection_checkpoints AS
SELECT k.campaign_id, k.projector,
       coalesce(m.applied_seq, k.applied_seq) AS applied_seq,
       coalesce(m.moved_at, k.updated_at) AS updated_at,
       k.bucket
FROM projection_checkpoint_keys k
LEFT JOIN (
    SELECT DISTINCT ON (bucket, campaign_id, projector)
           bucket, campaign_id, projector, applied_seq, moved_at
    FROM projection_checkpoint_moves
    ORDER BY bucket, campaign_id, projector, n DESC
) m ON m.bucket = k.bucket AND m.campaign_id = k.campaign_id AND m.projector = k.projector;

-- An install already distributed on Citus distributes the moves beside the keys.
DO $$
BEGIN
    IF to_regclass('pg_catalog.pg_dist_partition') IS NULL THEN
        RETURN;
    END IF;
    IF EXISTS (SELECT 1 FROM pg_catalog.pg_dist_partition p
               WHERE p.logicalrelid = 'projection_checkpoint_keys'::regclass) THEN
        PERFORM create_distributed_table('projection_checkpoint_moves', 'bucket',
                                         colocate_with => current_schema() || '.event_journal');
    END IF;
END
$$;
