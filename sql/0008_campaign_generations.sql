-- Campaign rows in generations (issue 38): a snapshot held elsewhere (a pg_dump, a report, a
-- session idle in a transaction) keeps alive every version younger than it, and vacuum may
-- remove none of them. A campaign row is inserted, updated and deleted about once per event;
-- under a held snapshot the claim index's dead entries and each campaign's dead versions grew
-- with the hold, and every claim, ring refresh and settle stepped over them. Only TRUNCATE
-- gives that space back under a held snapshot, so the campaign rows now live in three
-- partitions (`slot` 0, 1, 2), one per ten-second period in turn (`outbox_queue_slot`): a new
-- row goes to the current period's slot, and a worker rotates the queue (`outbox_rotate`):
-- once per period it moves the few live rows of the slot two periods old into the current
-- one and truncates it, under a short lock_timeout. What a held snapshot can cost the claim
-- is then at most three periods of dead versions, however long it is held.
--
-- A campaign still has at most one campaign row, in whichever slot: no unique index spans
-- partitions, so the rule is kept by who may insert one (docs/semantics.md, S26).

-- The table as it was, under another name: its rows are copied, then it goes.
ALTER TABLE projection_apply_campaigns RENAME TO projection_apply_campaigns_unpartitioned;
ALTER INDEX projection_apply_campaigns_pkey RENAME TO projection_apply_campaigns_unpartitioned_pkey;
ALTER INDEX projection_apply_campaigns_claim_idx
    RENAME TO projection_apply_campaigns_unpartitioned_claim_idx;

CREATE TABLE projection_apply_campaigns (
    campaign_id text        NOT NULL,
    head_seq    bigint      NOT NULL,
    due_at      timestamptz NOT NULL,
    blocked     boolean     NOT NULL DEFAULT false,
    updated_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    bucket      integer     NOT NULL,
    slot        smallint    NOT NULL
        CONSTRAINT projection_apply_campaigns_slot_check CHECK (slot IN (0, 1, 2)),
    CONSTRAINT projection_apply_campaigns_bucket_check CHECK (bucket = outbox_bucket(campaign_id)),
    PRIMARY KEY (bucket, campaign_id, slot)
) PARTITION BY LIST (slot);

-- The claim reads this index from its start (one scan per slot, merged) and stops at the
-- first campaign not due yet: blocked campaigns are not in it.
CREATE INDEX projection_apply_campaigns_claim_idx
    ON projection_apply_campaigns (bucket, due_at)
    WHERE NOT blocked;

-- Each slot is written and emptied whole: autovacuum still tidies a slot between rotations
-- when no snapshot holds it back, and room is kept for HOT updates.
CREATE TABLE projection_apply_campaigns_0 PARTITION OF projection_apply_campaigns
    FOR VALUES IN (0)
    WITH (fillfactor = 70, autovacuum_vacuum_scale_factor = 0.01,
          autovacuum_vacuum_threshold = 1000, autovacuum_vacuum_cost_delay = 0,
          autovacuum_analyze_scale_factor = 0.02, autovacuum_analyze_threshold = 1000);
CREATE TABLE projection_apply_campaigns_1 PARTITION OF projection_apply_campaigns
    FOR VALUES IN (1)
    WITH (fillfactor = 70, autovacuum_vacuum_scale_factor = 0.01,
          autovacuum_vacuum_threshold = 1000, autovacuum_vacuum_cost_delay = 0,
          autovacuum_analyze_scale_factor = 0.02, autovacuum_analyze_threshold = 1000);
CREATE TABLE projection_apply_campaigns_2 PARTITION OF projection_apply_campaigns
    FOR VALUES IN (2)
    WITH (fillfactor = 70, autovacuum_vacuum_scale_factor = 0.01,
          autovacuum_vacuum_threshold = 1000, autovacuum_vacuum_cost_delay = 0,
          autovacuum_analyze_scale_factor = 0.02, autovacuum_analyze_threshold = 1000);

-- An install already distributed on Citus keeps the table distributed, co-located with the
-- journal, before its rows come back (`maintenance distribute` does the same for a new one).
DO $$
DECLARE
    distributed boolean := false;
BEGIN
    IF to_regclass('pg_catalog.pg_dist_partition') IS NOT NULL THEN
        EXECUTE 'SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_dist_partition p '
                'WHERE p.logicalrelid = $1::regclass)'
            INTO distributed USING 'projection_apply_campaigns_unpartitioned';
    END IF;
    IF distributed THEN
        EXECUTE format(
            'SELECT create_distributed_table(%L, %L, colocate_with => %L)',
            'projection_apply_campaigns', 'bucket',
            current_schema() || '.event_journal');
    END IF;
END
$$;

-- Every existing row starts in slot 0: any slot is a valid place, and the first rotations
-- move what stays live.
INSERT INTO projection_apply_campaigns (bucket, campaign_id, head_seq, due_at, blocked,
                                        updated_at, slot)
SELECT bucket, campaign_id, head_seq, due_at, blocked, updated_at, 0
FROM projection_apply_campaigns_unpartitioned;

DROP TABLE projection_apply_campaigns_unpartitioned;
