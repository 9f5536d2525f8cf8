-- Operators' actions on work rows beyond the requeue: a dead row can be discarded (its work row
-- deleted, its event kept in the journal, the ordered projectors' checkpoints moved past it so
-- the campaign's later rows apply). The audit says which action each entry records; entries
-- written before this migration are requeues. A constant default adds the column without
-- rewriting the table.
ALTER TABLE outbox_requeue_audit
    ADD COLUMN action text NOT NULL DEFAULT 'requeue'
        CONSTRAINT outbox_requeue_audit_action_check CHECK (action IN ('requeue', 'discard'));

-- The attention index: rows that are not simply waiting (failed, dead, leased), with their
-- status. Operators' reads (counts by status, blocked campaigns, dead rows and their groups)
-- find them here without visiting the pending backlog, whose size they must not depend on.
-- Only a row entering one of those statuses writes an entry: appends and the usual
-- claim-apply-delete path never touch it. Built in the migration's transaction (it blocks
-- writes to the queue while it reads the table once; seconds at a million rows).
CREATE INDEX projection_apply_outbox_attention_idx
    ON projection_apply_outbox (campaign_id, seq) INCLUDE (status)
    WHERE status <> 'pending';
