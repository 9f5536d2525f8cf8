-- A projector's definition is a contract (S33): what decides what a projector owes and how it
-- is guarded (its types, guard, kind, transactional, start, a SQL projector's function) is
-- recorded with it, with a short fingerprint of it. A worker whose definition of a recorded
-- projector differs is refused at start; a change safe in place is recorded by an operator
-- (`maintenance projector-redefine`, audited). A record from before this migration has no
-- definition: the first worker of this release to record the projector fills it in, provided
-- the types, guard and transactional it kept agree. A worker of the previous release records
-- its projectors without one, as before.
ALTER TABLE outbox_projectors
    ADD COLUMN definition jsonb,
    ADD COLUMN fingerprint text;

-- What each worker runs (projector -> fingerprint of its definition), written as it registers
-- and with each heartbeat (a projector an operator redefined drops out of it): the report
-- tells a projector no live worker runs. NULL for a worker of an earlier release.
ALTER TABLE outbox_workers
    ADD COLUMN projectors jsonb;

ALTER TABLE outbox_projector_audit
    DROP CONSTRAINT outbox_projector_audit_action_check,
    ADD CONSTRAINT outbox_projector_audit_action_check
        CHECK (action IN ('pause', 'resume', 'retire', 'promote', 'redefine'));
