-- The catch-up engine's record of its builds (S30): where each projector's latest build
-- stands, for the report, the console and the metrics, and where a killed one resumes from.
-- A build's state is `running` while it runs, `stopped` when it ended before its last campaign
-- (cancelled, or the process ended: the report tells a killed one by the build's lock, gone
-- with its session) and `complete` when every campaign was walked. Local to the coordinator
-- on Citus: no statement joins them with a distributed table.
CREATE TABLE outbox_builds (
    projector       text        PRIMARY KEY,
    kind            text        NOT NULL CONSTRAINT outbox_builds_kind_check
                                    CHECK (kind IN ('catch-up', 'in-place', 'replay')),
    state           text        NOT NULL CONSTRAINT outbox_builds_state_check
                                    CHECK (state IN ('running', 'stopped', 'complete')),
    started_at      timestamptz NOT NULL DEFAULT clock_timestamp(),
    updated_at      timestamptz NOT NULL DEFAULT clock_timestamp(),
    events_total    bigint      NOT NULL DEFAULT 0,
    campaigns_total bigint      NOT NULL DEFAULT 0,
    seconds         double precision NOT NULL DEFAULT 0
);

-- A build's part in each bucket, moved in the transaction of each of its steps there (so a
-- kill loses none of it): events applied, campaigns brought to their head, skipped (a batch
-- held them) and failed, from the build's first start across its resumes; and, for an
-- in-place rebuild, its resume point: every campaign of the bucket up to `after_campaign` (in
-- key order) has been reset. Gone when a new build of the projector starts.
CREATE TABLE outbox_build_buckets (
    projector      text    NOT NULL,
    bucket         integer NOT NULL,
    after_campaign text,
    events         bigint  NOT NULL DEFAULT 0,
    campaigns      bigint  NOT NULL DEFAULT 0,
    skipped        bigint  NOT NULL DEFAULT 0,
    failed         bigint  NOT NULL DEFAULT 0,
    PRIMARY KEY (projector, bucket)
);
