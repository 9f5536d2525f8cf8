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

-- Error groups: failed and dead rows grouped by the projector that raised and the shape of the
-- error, so one poisoned projector's thousand rows read as one line and requeue as one group.
-- `last_error` is `Type: message` on one line, prefixed `projector 'name': ` when a projector
-- raised it. The shape is the error without that prefix (the projector is named apart), with
-- what varies between occurrences of one failure, quoted values and (signed) numbers,
-- replaced by `?` (one regular expression, which turns the prefix into `projector ?: `, then
-- a string test that drops it: these run per row). The fingerprint names a group in commands
-- and URLs: 12 hex digits of the MD5 of the projector and the shape.
CREATE FUNCTION outbox_error_projector(error text) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN substring(error FROM '^projector [''"](.*?)[''"]: ');

CREATE FUNCTION outbox_error_shape(error text) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN (
    SELECT CASE WHEN starts_with(m.shape, 'projector ?: ') THEN substr(m.shape, 14) ELSE m.shape END
    FROM (SELECT regexp_replace(error, '''[^'']*''|"[^"]*"|-?[0-9]+(\.[0-9]+)?', '?', 'g') AS shape) m
);

CREATE FUNCTION outbox_error_fingerprint(projector text, shape text) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN left(md5(coalesce(projector, '') || E'\n' || coalesce(shape, '')), 12);

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
