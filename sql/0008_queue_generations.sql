-- The queue in generations (issue 38): a snapshot held elsewhere (a pg_dump, a report, a
-- session idle in a transaction) keeps alive every version younger than it, and vacuum may
-- remove none of them. A work row is inserted and deleted per event, a campaign row inserted,
-- updated and deleted about as often; under a held snapshot their dead versions and index
-- entries grew with the hold, and every claim, ring refresh, settle and append stepped over
-- them. Only TRUNCATE gives that space back under a held snapshot, so both tables now live in
-- three partitions (`slot` 0, 1, 2), one per ten-second period in turn (`outbox_queue_slot`):
-- a new row goes to the current period's slot (the column's default), and a worker rotates
-- the queue (`outbox_rotate`): once per period it moves the few live rows of the slot two
-- periods old into the current one and truncates it, under a short lock_timeout. What a held
-- snapshot can cost the claim is then at most three periods of dead versions, however long
-- it is held.
--
-- A campaign still has at most one campaign row, and an event at most one work row, in
-- whichever slot: no unique index spans partitions, so the rule is kept by who may insert one
-- (docs/semantics.md, S26).

-- The slot of the period `p_at` falls in: periods of ten seconds, three slots in turn. The
-- one function a migration defines after the first release: the queue tables' `slot` default
-- calls it, so it must exist before them (as `outbox_bucket` must before the CHECKs that call
-- it). Immutable (the epoch of an instant does not depend on the time zone), so that a
-- statement that writes a distributed table on Citus may call it on a parameter.
CREATE FUNCTION outbox_queue_slot(p_at timestamptz) RETURNS smallint
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
RETURN (((floor(extract(epoch FROM p_at) / 10)::bigint % 3) + 3) % 3)::smallint;

-- The campaign rows as they were, under another name: their rows are copied, then it goes.
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
    slot        smallint    NOT NULL DEFAULT outbox_queue_slot(clock_timestamp()),
    CONSTRAINT projection_apply_campaigns_bucket_check CHECK (bucket = outbox_bucket(campaign_id)),
    PRIMARY KEY (bucket, campaign_id, slot)
) PARTITION BY LIST (slot);

-- The claim reads this index from its start (one scan per slot, merged) and stops at the
-- first campaign not due yet: blocked campaigns are not in it.
CREATE INDEX projection_apply_campaigns_claim_idx
    ON projection_apply_campaigns (bucket, due_at)
    WHERE NOT blocked;

-- The work rows, the same way: their columns, checks, key (with the slot), the claim index
-- (ordering `none`) and the attention index. Not their foreign key to the journal: a row
-- whose event is gone (written around the append, a partial restore; S8 fails it with a clear
-- error and keeps it for an operator) could not be moved to another slot under it, and would
-- keep its slot from ever being emptied. The append writes the event before its work row, and
-- nothing deletes journal rows.
ALTER TABLE projection_apply_outbox RENAME TO projection_apply_outbox_unpartitioned;
ALTER INDEX projection_apply_outbox_pkey RENAME TO projection_apply_outbox_unpartitioned_pkey;
ALTER INDEX projection_apply_outbox_claim_idx RENAME TO projection_apply_outbox_unpartitioned_claim_idx;
ALTER INDEX projection_apply_outbox_attention_idx
    RENAME TO projection_apply_outbox_unpartitioned_attention_idx;

CREATE TABLE projection_apply_outbox (
    campaign_id      text        NOT NULL,
    seq              bigint      NOT NULL,
    event_type       text        NOT NULL,
    status           text        NOT NULL DEFAULT 'pending'
        CONSTRAINT projection_apply_outbox_status_check
            CHECK (status IN ('pending', 'processing', 'failed', 'dead')),
    attempt_count    integer     NOT NULL DEFAULT 0
        CONSTRAINT projection_apply_outbox_attempt_count_check CHECK (attempt_count >= 0),
    next_attempt_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    last_error       text,
    enqueued_at      timestamptz NOT NULL DEFAULT clock_timestamp(),
    updated_at       timestamptz NOT NULL DEFAULT clock_timestamp(),
    seen_count       integer     NOT NULL DEFAULT 0
        CONSTRAINT projection_apply_outbox_seen_count_check CHECK (seen_count >= 0),
    first_seen_at    timestamptz,
    last_seen_at     timestamptz,
    lease_owner      text,
    claim_epoch      bigint,
    leased_at        timestamptz,
    lease_expires_at timestamptz,
    bucket           integer     NOT NULL,
    slot             smallint    NOT NULL DEFAULT outbox_queue_slot(clock_timestamp()),
    CONSTRAINT projection_apply_outbox_bucket_check CHECK (bucket = outbox_bucket(campaign_id)),
    CONSTRAINT projection_apply_outbox_lease_check CHECK (
        status <> 'processing'
        OR (lease_owner IS NOT NULL AND claim_epoch IS NOT NULL AND lease_expires_at IS NOT NULL)),
    PRIMARY KEY (bucket, campaign_id, seq, slot)
) PARTITION BY LIST (slot);

CREATE INDEX projection_apply_outbox_claim_idx
    ON projection_apply_outbox (bucket, next_attempt_at, seq)
    WHERE status IN ('pending', 'failed');
CREATE INDEX projection_apply_outbox_attention_idx
    ON projection_apply_outbox (bucket, campaign_id, seq) INCLUDE (status)
    WHERE status <> 'pending';

-- The slots. Each is written and emptied whole; autovacuum still tidies one between rotations
-- when no snapshot holds it back, and room is kept for HOT updates.
DO $$
DECLARE
    vacuum text := 'autovacuum_vacuum_scale_factor = 0.01, autovacuum_vacuum_threshold = 1000, '
                   'autovacuum_vacuum_cost_delay = 0, autovacuum_analyze_scale_factor = 0.02, '
                   'autovacuum_analyze_threshold = 1000';
BEGIN
    FOR s IN 0 .. 2 LOOP
        EXECUTE format('CREATE TABLE %I PARTITION OF projection_apply_campaigns '
                       'FOR VALUES IN (%s) WITH (fillfactor = 70, %s)',
                       'projection_apply_campaigns_' || s, s, vacuum);
        EXECUTE format('CREATE TABLE %I PARTITION OF projection_apply_outbox '
                       'FOR VALUES IN (%s) WITH (fillfactor = 90, %s)',
                       'projection_apply_outbox_' || s, s, vacuum);
    END LOOP;
END
$$;

-- An install already distributed on Citus keeps the tables distributed, co-located with the
-- journal, before their rows come back (`maintenance distribute` does the same for a new one).
DO $$
DECLARE
    t text;
    distributed boolean;
BEGIN
    IF to_regclass('pg_catalog.pg_dist_partition') IS NULL THEN
        RETURN;
    END IF;
    FOREACH t IN ARRAY ARRAY['projection_apply_campaigns', 'projection_apply_outbox'] LOOP
        EXECUTE 'SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_dist_partition p '
                'WHERE p.logicalrelid = $1::regclass)'
            INTO distributed USING t || '_unpartitioned';
        IF distributed THEN
            EXECUTE format(
                'SELECT create_distributed_table(%L, %L, colocate_with => %L)',
                t, 'bucket', current_schema() || '.event_journal');
        END IF;
    END LOOP;
END
$$;

-- Every existing row starts in slot 0: any slot is a valid place, and the first rotations
-- move what stays live.
INSERT INTO projection_apply_campaigns (bucket, campaign_id, head_seq, due_at, blocked,
                                        updated_at, slot)
SELECT bucket, campaign_id, head_seq, due_at, blocked, updated_at, 0
FROM projection_apply_campaigns_unpartitioned;
INSERT INTO projection_apply_outbox (bucket, campaign_id, seq, event_type, status,
                                     attempt_count, next_attempt_at, last_error, enqueued_at,
                                     updated_at, seen_count, first_seen_at, last_seen_at,
                                     lease_owner, claim_epoch, leased_at, lease_expires_at, slot)
SELECT bucket, campaign_id, seq, event_type, status, attempt_count, next_attempt_at,
       last_error, enqueued_at, updated_at, seen_count, first_seen_at, last_seen_at,
       lease_owner, claim_epoch, leased_at, lease_expires_at, 0
FROM projection_apply_outbox_unpartitioned;

DROP TABLE projection_apply_campaigns_unpartitioned;
DROP TABLE projection_apply_outbox_unpartitioned;
