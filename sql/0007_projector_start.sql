-- Where a projector starts (S25). `beginning` (an ordered projector's default): it catches up
-- from the journal on its own, dormant campaigns too. The workers that run it sweep the
-- journal's campaigns (`campaign_heads`, in key order) a chunk at a time, giving each campaign
-- it is behind on a catch-up hold (seq 0, due now): the worker then takes it on from its
-- checkpoint through the journal, as any held ordered projector. The sweep's cursor is the
-- last campaign it reached (`sweep_bucket`, `sweep_campaign`); `swept_at`, when it reached
-- the end. `now` (the default of the others; lease-mode projectors never replay side effects
-- unasked): no sweep, and an ordered one starts on each campaign at the first event the queue
-- holds for it when a worker first meets the campaign.
ALTER TABLE outbox_projectors
    ADD COLUMN start text NOT NULL DEFAULT 'now'
        CONSTRAINT outbox_projectors_start_check CHECK (start IN ('beginning', 'now')),
    ADD COLUMN sweep_bucket integer,
    ADD COLUMN sweep_campaign text,
    ADD COLUMN swept_at timestamptz;

-- The projectors recorded before: running already, nothing to sweep.
UPDATE outbox_projectors SET swept_at = first_seen_at;
