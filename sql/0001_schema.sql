-- outbox schema, version 1: journal, campaign heads, the apply outbox, projection checkpoints,
-- processed markers, append idempotency keys, consumer claims, worker registry, requeue audit.
--
-- Every key starts with campaign_id where a campaign is involved, so the tables can be
-- distributed by campaign_id. Instants default to clock_timestamp(), never now(): a long
-- transaction must not stamp rows with its start time.

-- The authoritative, append-only event log.
CREATE TABLE event_journal (
    campaign_id text        NOT NULL,
    seq         bigint      NOT NULL CHECK (seq >= 1),
    event_type  text        NOT NULL,
    payload     jsonb       NOT NULL,
    metadata    jsonb       NOT NULL DEFAULT '{}'::jsonb,
    recorded_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (campaign_id, seq)
);

-- One row per campaign: the last allocated seq. Appends lock it to allocate gap-free seqs.
CREATE TABLE campaign_heads (
    campaign_id text        PRIMARY KEY,
    last_seq    bigint      NOT NULL CHECK (last_seq >= 1),
    updated_at  timestamptz NOT NULL DEFAULT clock_timestamp()
) WITH (fillfactor = 70);

-- The work queue: one row per journaled event still to be applied to projections.
CREATE TABLE projection_apply_outbox (
    campaign_id     text        NOT NULL,
    seq             bigint      NOT NULL,
    event_type      text        NOT NULL,
    status          text        NOT NULL DEFAULT 'pending'
                    CHECK (status IN ('pending', 'processing', 'failed', 'dead')),
    attempt_count   integer     NOT NULL DEFAULT 0 CHECK (attempt_count >= 0),
    next_attempt_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    last_error      text,
    enqueued_at     timestamptz NOT NULL DEFAULT clock_timestamp(),
    updated_at      timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (campaign_id, seq),
    FOREIGN KEY (campaign_id, seq) REFERENCES event_journal (campaign_id, seq)
) WITH (
    -- Insert/delete churn: vacuum early and without throttling, keep room for HOT updates
    -- of failure bookkeeping.
    fillfactor = 90,
    autovacuum_vacuum_scale_factor = 0.01,
    autovacuum_vacuum_threshold = 1000,
    autovacuum_vacuum_cost_delay = 0,
    autovacuum_analyze_scale_factor = 0.02,
    autovacuum_analyze_threshold = 1000
);

-- Only claimable statuses are indexed, so dead rows never cost the claim anything, and the
-- range condition next_attempt_at <= now stops before rows that are not due yet.
CREATE INDEX projection_apply_outbox_claim_idx
    ON projection_apply_outbox (next_attempt_at, seq)
    WHERE status IN ('pending', 'failed');

-- Ordered projectors: the last applied seq per campaign, written in the apply transaction.
CREATE TABLE projection_checkpoints (
    campaign_id text        NOT NULL,
    projector   text        NOT NULL,
    applied_seq bigint      NOT NULL CHECK (applied_seq >= 0),
    updated_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (campaign_id, projector)
) WITH (
    fillfactor = 70,
    autovacuum_vacuum_scale_factor = 0.02,
    autovacuum_vacuum_cost_delay = 0
);
CREATE INDEX projection_checkpoints_projector_idx ON projection_checkpoints (projector);

-- Unordered idempotent projectors: one marker per handler and event, reserved before applying.
CREATE TABLE processed_markers (
    campaign_id text        NOT NULL,
    seq         bigint      NOT NULL,
    handler     text        NOT NULL,
    applied_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (campaign_id, seq, handler)
);
CREATE INDEX processed_markers_applied_at_idx ON processed_markers (applied_at);

-- Append idempotency keys, scoped to the campaign they appended to. first_seq/last_seq are
-- filled by the same statement that appends; a failed append rolls the key back with it.
CREATE TABLE append_idempotency_keys (
    campaign_id text        NOT NULL,
    idem_key    text        NOT NULL,
    first_seq   bigint,
    last_seq    bigint,
    created_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    expires_at  timestamptz NOT NULL,
    PRIMARY KEY (campaign_id, idem_key)
);
CREATE INDEX append_idempotency_keys_expires_at_idx ON append_idempotency_keys (expires_at);

-- Consumer dedup guard: one claim per scope, event and time bucket (the bucket is derived from
-- the event's own timestamp, never the consumer's clock).
CREATE TABLE consumer_claims (
    scope       text        NOT NULL,
    event_id    text        NOT NULL,
    bucket      date        NOT NULL,
    event_time  timestamptz NOT NULL,
    claimed_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (scope, event_id, bucket)
);
CREATE INDEX consumer_claims_bucket_idx ON consumer_claims (bucket);

-- Worker registry: what outbox-report shows as live workers.
CREATE TABLE outbox_workers (
    worker_id    text        PRIMARY KEY,
    host         text        NOT NULL,
    pid          integer     NOT NULL,
    mode         text        NOT NULL CHECK (mode IN ('apply', 'shadow')),
    concurrency  integer     NOT NULL DEFAULT 1,
    started_at   timestamptz NOT NULL DEFAULT clock_timestamp(),
    heartbeat_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    stopped_at   timestamptz,
    counters     jsonb       NOT NULL DEFAULT '{}'::jsonb
);
CREATE INDEX outbox_workers_heartbeat_at_idx ON outbox_workers (heartbeat_at);

-- Requeue audit: insert-only history of operator requeues.
CREATE TABLE outbox_requeue_audit (
    campaign_id              text        NOT NULL,
    seq                      bigint      NOT NULL,
    audit_id                 bigint      GENERATED ALWAYS AS IDENTITY,
    at                       timestamptz NOT NULL DEFAULT clock_timestamp(),
    actor                    text        NOT NULL,
    reason                   text,
    previous_status          text        NOT NULL,
    previous_attempt_count   integer     NOT NULL,
    previous_last_error      text,
    previous_next_attempt_at timestamptz,
    PRIMARY KEY (campaign_id, seq, audit_id)
);
CREATE INDEX outbox_requeue_audit_at_idx ON outbox_requeue_audit (at);
