-- Shadow worker observations (S14): how often and when a shadow worker saw a work row.
-- Nullable and defaulted, so adding them rewrites nothing and running workers are unaffected.
ALTER TABLE projection_apply_outbox
    ADD COLUMN seen_count    integer     NOT NULL DEFAULT 0 CHECK (seen_count >= 0),
    ADD COLUMN first_seen_at timestamptz,
    ADD COLUMN last_seen_at  timestamptz;
