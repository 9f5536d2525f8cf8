-- Operators' actions on work rows beyond the requeue: a dead row can be discarded (its work row
-- deleted, its event kept in the journal, the ordered projectors' checkpoints moved past it so
-- the campaign's later rows apply). The audit says which action each entry records; entries
-- written before this migration are requeues. A constant default adds the column without
-- rewriting the table.
ALTER TABLE outbox_requeue_audit
    ADD COLUMN action text NOT NULL DEFAULT 'requeue'
        CONSTRAINT outbox_requeue_audit_action_check CHECK (action IN ('requeue', 'discard'));
