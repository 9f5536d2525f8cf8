-- Retry now (`maintenance outbox-retry`): failed rows and holds an operator makes due at once,
-- after a fix, their attempts kept; audited beside requeues and discards as `retry`.
ALTER TABLE outbox_requeue_audit
    DROP CONSTRAINT outbox_requeue_audit_action_check,
    ADD CONSTRAINT outbox_requeue_audit_action_check
        CHECK (action IN ('requeue', 'discard', 'retry'));
