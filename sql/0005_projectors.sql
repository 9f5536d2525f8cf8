-- The projectors the database knows: each worker that applies records the projectors it runs
-- (name, subscribed types, ordered, transactional; when first and last seen) as it starts. A
-- projector leaves only through `maintenance projector-retire`, audited beside pauses and
-- resumes: never because one worker's code lacks it (a rolling deploy runs both versions).
CREATE TABLE outbox_projectors (
    projector     text        PRIMARY KEY,
    events        text[]      NOT NULL,
    ordered       boolean     NOT NULL,
    transactional boolean     NOT NULL,
    first_seen_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    last_seen_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    last_seen_by  text        NOT NULL
);

ALTER TABLE outbox_projector_audit
    DROP CONSTRAINT outbox_projector_audit_action_check,
    ADD CONSTRAINT outbox_projector_audit_action_check
        CHECK (action IN ('pause', 'resume', 'retire'));
