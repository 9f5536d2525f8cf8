-- Lease mode (S13): rows of events that a non-transactional projector handles are applied
-- outside the claim's transaction. The claim commits them as `processing` with an owner (the
-- worker's id), a claim epoch incremented on every claim, and a lease expiry from the
-- database clock. While a row is processing, `next_attempt_at` equals `lease_expires_at`:
-- the row is due again (reclaimed by the ordinary claim) exactly when its lease expires, and
-- every query that reads a live row's due time needs no special case. Completion and failure
-- are compare-and-set on owner, epoch and status, so a worker whose lease was taken over
-- changes nothing. All columns are nullable: adding them rewrites nothing, and rows that were
-- never leased carry no extra bytes.
ALTER TABLE projection_apply_outbox
    ADD COLUMN lease_owner      text,
    ADD COLUMN claim_epoch      bigint,
    ADD COLUMN leased_at        timestamptz,
    ADD COLUMN lease_expires_at timestamptz;

ALTER TABLE projection_apply_outbox
    ADD CONSTRAINT projection_apply_outbox_lease_check CHECK (
        status <> 'processing'
        OR (lease_owner IS NOT NULL AND claim_epoch IS NOT NULL AND lease_expires_at IS NOT NULL)
    ) NOT VALID;
-- Validating scans the table under a lock that lets appends and workers go on.
ALTER TABLE projection_apply_outbox VALIDATE CONSTRAINT projection_apply_outbox_lease_check;
