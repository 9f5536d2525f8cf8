-- Holds: what one projector still owes on a campaign, kept apart from the work rows so that the
-- campaign's other projectors go on (S24). A hold is written only when a projector does not
-- apply an event it owes with the others: it failed on it (attempts, backoff, the error, dead
-- after the last attempt), it is paused, or, ordered, it has the journal to catch up. Nothing
-- is written per projector while every projector applies: an append still writes one work row
-- per event and nothing else.
--   - An ordered projector has at most one hold per campaign, at the first event it lacks: it
--     is stopped on that campaign from there (its checkpoint says where it is) and, when the
--     hold is due again, goes on from its checkpoint through the journal to the campaign's end.
--     The campaign's later rows are deleted once the other projectors applied them: the journal
--     serves them to it.
--   - An unordered projector's hold is on one event, whose work row stays until it applies it.
-- A work row that holds exist for keeps the seed's columns as a reader expects them: `failed`
-- while some holder will try again (attempts the most any holder made, next attempt the
-- earliest, last_error the latest), `dead` once every holder is dead on it, `pending` while its
-- holders only wait. Dead holds are left for an operator (requeue or discard, per projector).
CREATE TABLE projection_holds (
    bucket          integer     NOT NULL,
    campaign_id     text        NOT NULL,
    projector       text        NOT NULL,
    seq             bigint      NOT NULL,
    status          text        NOT NULL
        CONSTRAINT projection_holds_status_check CHECK (status IN ('pending', 'failed', 'dead')),
    attempt_count   integer     NOT NULL DEFAULT 0,
    next_attempt_at timestamptz NOT NULL,
    last_error      text,
    created_at      timestamptz NOT NULL DEFAULT clock_timestamp(),
    updated_at      timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (bucket, campaign_id, projector, seq),
    CONSTRAINT projection_holds_bucket_check CHECK (bucket = outbox_bucket(campaign_id))
);

-- The report, the failures listing and the metrics count holds per projector.
CREATE INDEX projection_holds_projector_idx ON projection_holds (projector, status);

-- Failed and dead rows of an existing install become holds of the projector their last_error
-- names (`projector 'name': ...`); a failure no projector raised (a missing or undecodable
-- event, a gap in the journal) stays the row's own and holds its campaign as before.
INSERT INTO projection_holds (bucket, campaign_id, projector, seq, status, attempt_count,
                              next_attempt_at, last_error, updated_at)
SELECT o.bucket, o.campaign_id, p.projector, o.seq, o.status, o.attempt_count,
       o.next_attempt_at, o.last_error, o.updated_at
FROM projection_apply_outbox o
CROSS JOIN LATERAL (
    SELECT substring(o.last_error FROM '^projector [''"](.*?)[''"]: ') AS projector
) p
WHERE o.status IN ('failed', 'dead') AND p.projector IS NOT NULL;

-- Campaigns those rows blocked go on for their other projectors: due now, the worker works
-- out the rest (what each hold still stops) at its next batch.
UPDATE projection_apply_campaigns c
SET blocked = false, due_at = least(c.due_at, clock_timestamp()), updated_at = clock_timestamp()
WHERE EXISTS (
    SELECT 1 FROM projection_holds h
    WHERE h.bucket = c.bucket AND h.campaign_id = c.campaign_id
);

-- Requeues and discards act on one projector's holds, or on all of a row's (no projector).
ALTER TABLE outbox_requeue_audit ADD COLUMN projector text;
