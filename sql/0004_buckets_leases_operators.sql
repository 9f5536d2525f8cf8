-- Everything the schema gained after 0.1.0 (0001-0003), in one migration: append keys'
-- fingerprints, consumer claims' sources, lease mode, the operators' audit actions and
-- attention index, paused projectors, and buckets. It runs the same on a fresh install and on
-- a 0.1.0 database holding data, which it rewrites once (the bucket column, under locks that
-- stop appends and workers: a maintenance window, sized by the journal; docs/scaling.md).
-- The server functions are not here: each has its one definition in a `*_fn.sql` file beside
-- the module that calls it, applied by `maintenance migrate` after the migrations. Only the two
-- bucket functions are made here, because the number of buckets is written into their bodies.

-- Append keys remember a fingerprint of the events they appended, so a retry with the same key
-- but different events is refused instead of answered with the first result. Keys 0.1.0 wrote
-- have none and are honoured as before until they expire.
ALTER TABLE append_idempotency_keys
    ADD COLUMN fingerprint bytea;

-- Consumer claims keep where the message came from (forensic only: never part of the key).
ALTER TABLE consumer_claims
    ADD COLUMN source_topic     text,
    ADD COLUMN source_partition integer,
    ADD COLUMN source_offset    bigint;

COMMENT ON COLUMN consumer_claims.bucket IS
    'Monday (UTC) of the week holding event_time; the claim covers that week';

-- Lease mode (S13): rows of events that a non-transactional projector handles are applied
-- outside the claim's transaction. The claim commits them as `processing` with an owner (the
-- worker's id), a claim epoch incremented on every claim, and a lease expiry from the
-- database clock. While a row is processing, `next_attempt_at` equals `lease_expires_at`:
-- the row is due again (reclaimed by the ordinary claim) exactly when its lease expires, and
-- every query that reads a live row's due time needs no special case. Completion and failure
-- are compare-and-set on owner, epoch and status, so a worker whose lease was taken over
-- changes nothing. All columns are nullable: adding them rewrites nothing, and rows that were
-- never leased carry no extra bytes.
ALTER TABLE projection_apply_outbox
    ADD COLUMN lease_owner      text,
    ADD COLUMN claim_epoch      bigint,
    ADD COLUMN leased_at        timestamptz,
    ADD COLUMN lease_expires_at timestamptz;

ALTER TABLE projection_apply_outbox
    ADD CONSTRAINT projection_apply_outbox_lease_check CHECK (
        status <> 'processing'
        OR (lease_owner IS NOT NULL AND claim_epoch IS NOT NULL AND lease_expires_at IS NOT NULL)
    ) NOT VALID;
-- Validating scans the table under a lock that lets appends and workers go on.
ALTER TABLE projection_apply_outbox VALIDATE CONSTRAINT projection_apply_outbox_lease_check;

-- The work rows' statement trigger goes: the append function creates its campaign's queue row
-- itself, and only when the campaign has none. The trigger looked the campaign's first row up
-- on every append, with a plan cached in the session: a queue analyzed while empty turned that
-- lookup into a scan of the whole queue per append, exactly while a backlog grows. Reconcile
-- and requeue refresh the campaign rows of the work rows they write; a tool that inserts work
-- rows by hand runs `maintenance reconcile` after.
DROP TRIGGER projection_apply_outbox_enqueued ON projection_apply_outbox;
DROP FUNCTION projection_apply_enqueued();

-- Operators' actions on work rows beyond the requeue: a dead row can be discarded (its work row
-- deleted, its event kept in the journal, the ordered projectors' checkpoints moved past it so
-- the campaign's later rows apply). The audit says which action each entry records; entries
-- 0.1.0 wrote are requeues. A constant default adds the column without rewriting the table.
ALTER TABLE outbox_requeue_audit
    ADD COLUMN action text NOT NULL DEFAULT 'requeue'
        CONSTRAINT outbox_requeue_audit_action_check CHECK (action IN ('requeue', 'discard'));

-- Paused projectors: an operator's hold on one projector (a bug being fixed, a downstream
-- outage). Workers read this table at most once per poll interval and leave the events a paused
-- projector subscribes to where they are: under campaign ordering the campaign waits at that
-- event, under ordering `none` the row waits; no attempt is consumed, and the wait is re-checked
-- every poll interval, so a resume takes effect within about two of them.
CREATE TABLE outbox_projector_pauses (
    projector text        PRIMARY KEY,
    paused_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    paused_by text        NOT NULL,
    reason    text
);

-- Pauses and resumes are audited like requeues and discards: who, when, why (insert-only).
CREATE TABLE outbox_projector_audit (
    audit_id  bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at        timestamptz NOT NULL DEFAULT clock_timestamp(),
    projector text        NOT NULL,
    action    text        NOT NULL CONSTRAINT outbox_projector_audit_action_check
                              CHECK (action IN ('pause', 'resume')),
    actor     text        NOT NULL,
    reason    text
);

-- Buckets: every campaign-keyed row carries `bucket = outbox_bucket(campaign_id)`, a number
-- in 0..N-1 fixed when this migration first runs, and every primary key, the work rows'
-- foreign key and the queue's indexes lead with it. A batch claims and settles in one bucket,
-- and every statement on these tables names its bucket, so on Citus (tables distributed by
-- `bucket`, co-located: `maintenance distribute`) each one runs on one shard, and on plain
-- PostgreSQL each one reads one bucket's part of an index.
--
-- N comes from the setting `outbox.buckets` (the migrator sets it from OUTBOX_BUCKETS; a
-- psql script sets it with SET), default 64, at most 4096. It is written into the two
-- functions below and never changes afterwards: a bucket is where a campaign's rows live.
-- On Citus a bucket is the unit that moves between nodes (shards move, buckets never do).
-- Both are SQL-standard bodies (bound when created, whatever a caller's search_path) without a
-- SET clause: a CHECK below calls outbox_bucket on every row written, and a SET clause would
-- cost each call about 3.5 us (it keeps PostgreSQL from inlining the body).
--
-- The rules the statements keep, so that one definition serves both servers (Citus refuses the
-- others): no volatile function in a statement that writes (each call takes its instant once,
-- into a variable or a parameter); a scalar bucket per statement (an array of buckets cannot
-- be routed under a generic plan); no wake-up from a trigger (the append's own session
-- sends the NOTIFY, whose payload is the bucket, so a worker claims there first).
DO $$
DECLARE
    n integer := coalesce(nullif(current_setting('outbox.buckets', true), '')::integer, 64);
BEGIN
    IF n NOT BETWEEN 1 AND 4096 THEN
        RAISE EXCEPTION 'outbox.buckets must be between 1 and 4096, got %', n;
    END IF;
    EXECUTE format(
        'CREATE FUNCTION outbox_bucket_count() RETURNS integer '
        'LANGUAGE sql IMMUTABLE PARALLEL SAFE RETURN %s', n);
    -- The first 32 bits of the id's MD5 (UTF-8), modulo N: outbox.buckets.bucket_of in Python.
    EXECUTE format(
        'CREATE FUNCTION outbox_bucket(campaign_id text) RETURNS integer '
        'LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE '
        'RETURN ((''x'' || left(md5(campaign_id), 8))::bit(32)::bigint %% %s)::integer', n);
END
$$;

COMMENT ON FUNCTION outbox_bucket_count() IS
    'How many buckets the outbox''s campaign-keyed tables are split into; fixed at migration';
COMMENT ON FUNCTION outbox_bucket(text) IS
    'The bucket of a campaign: the first 32 bits of md5(campaign_id) modulo outbox_bucket_count()';

-- The column on every campaign-keyed table, filled in place, then the keys rebuilt around it.
ALTER TABLE event_journal ADD COLUMN bucket integer;
ALTER TABLE campaign_heads ADD COLUMN bucket integer;
ALTER TABLE projection_apply_outbox ADD COLUMN bucket integer;
ALTER TABLE projection_apply_campaigns ADD COLUMN bucket integer;
ALTER TABLE projection_checkpoints ADD COLUMN bucket integer;
ALTER TABLE processed_markers ADD COLUMN bucket integer;
ALTER TABLE append_idempotency_keys ADD COLUMN bucket integer;

UPDATE event_journal SET bucket = outbox_bucket(campaign_id);
UPDATE campaign_heads SET bucket = outbox_bucket(campaign_id);
UPDATE projection_apply_outbox SET bucket = outbox_bucket(campaign_id);
UPDATE projection_apply_campaigns SET bucket = outbox_bucket(campaign_id);
UPDATE projection_checkpoints SET bucket = outbox_bucket(campaign_id);
UPDATE processed_markers SET bucket = outbox_bucket(campaign_id);
UPDATE append_idempotency_keys SET bucket = outbox_bucket(campaign_id);

ALTER TABLE projection_apply_outbox
    DROP CONSTRAINT projection_apply_outbox_campaign_id_seq_fkey,
    DROP CONSTRAINT projection_apply_outbox_pkey;
DROP INDEX projection_apply_outbox_claim_idx;
DROP INDEX projection_apply_campaigns_claim_idx;

ALTER TABLE event_journal
    ALTER COLUMN bucket SET NOT NULL,
    ADD CONSTRAINT event_journal_bucket_check CHECK (bucket = outbox_bucket(campaign_id)),
    DROP CONSTRAINT event_journal_pkey,
    ADD PRIMARY KEY (bucket, campaign_id, seq);
ALTER TABLE campaign_heads
    ALTER COLUMN bucket SET NOT NULL,
    ADD CONSTRAINT campaign_heads_bucket_check CHECK (bucket = outbox_bucket(campaign_id)),
    DROP CONSTRAINT campaign_heads_pkey,
    ADD PRIMARY KEY (bucket, campaign_id);
ALTER TABLE projection_apply_outbox
    ALTER COLUMN bucket SET NOT NULL,
    ADD CONSTRAINT projection_apply_outbox_bucket_check
        CHECK (bucket = outbox_bucket(campaign_id)),
    ADD PRIMARY KEY (bucket, campaign_id, seq),
    ADD CONSTRAINT projection_apply_outbox_event_fkey FOREIGN KEY (bucket, campaign_id, seq)
        REFERENCES event_journal (bucket, campaign_id, seq);
ALTER TABLE projection_apply_campaigns
    ALTER COLUMN bucket SET NOT NULL,
    ADD CONSTRAINT projection_apply_campaigns_bucket_check
        CHECK (bucket = outbox_bucket(campaign_id)),
    DROP CONSTRAINT projection_apply_campaigns_pkey,
    ADD PRIMARY KEY (bucket, campaign_id);
ALTER TABLE projection_checkpoints
    ALTER COLUMN bucket SET NOT NULL,
    ADD CONSTRAINT projection_checkpoints_bucket_check
        CHECK (bucket = outbox_bucket(campaign_id)),
    DROP CONSTRAINT projection_checkpoints_pkey,
    ADD PRIMARY KEY (bucket, campaign_id, projector);
ALTER TABLE processed_markers
    ALTER COLUMN bucket SET NOT NULL,
    ADD CONSTRAINT processed_markers_bucket_check CHECK (bucket = outbox_bucket(campaign_id)),
    DROP CONSTRAINT processed_markers_pkey,
    ADD PRIMARY KEY (bucket, campaign_id, seq, handler);
ALTER TABLE append_idempotency_keys
    ALTER COLUMN bucket SET NOT NULL,
    ADD CONSTRAINT append_idempotency_keys_bucket_check
        CHECK (bucket = outbox_bucket(campaign_id)),
    DROP CONSTRAINT append_idempotency_keys_pkey,
    ADD PRIMARY KEY (bucket, campaign_id, idem_key);

-- The queue's indexes, each within a bucket: a claim reads its bucket's due part. The claim
-- index holds only claimable rows, so dead rows never cost the claim anything, and its range
-- condition next_attempt_at <= now stops before rows that are not due yet; the campaign
-- queue's holds no blocked campaign, so a blocked campaign's backlog costs a claim nothing.
CREATE INDEX projection_apply_outbox_claim_idx
    ON projection_apply_outbox (bucket, next_attempt_at, seq)
    WHERE status IN ('pending', 'failed');
CREATE INDEX projection_apply_campaigns_claim_idx
    ON projection_apply_campaigns (bucket, due_at)
    WHERE NOT blocked;

-- The attention index: rows that are not simply waiting (failed, dead, leased), with their
-- status. Operators' reads (counts by status, blocked campaigns, dead rows and their groups)
-- find them here without visiting the pending backlog, whose size they must not depend on.
-- Only a row entering one of those statuses writes an entry: appends and the usual
-- claim-apply-delete path never touch it.
CREATE INDEX projection_apply_outbox_attention_idx
    ON projection_apply_outbox (bucket, campaign_id, seq) INCLUDE (status)
    WHERE status <> 'pending';
