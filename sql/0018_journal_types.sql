-- The journal by event type: the catch-up engine (S30) reads a projector's own events of a
-- campaign's range by it, so that a projector of sparse types (1% of the journal) reads its
-- events and not every position; a projector's count of what it lacks reads it too.
--
-- Built in the migration's transaction, which holds appends for as long as the build takes.
-- On a large journal, build it beforehand without holding them (the migration then finds it):
--   CREATE INDEX CONCURRENTLY IF NOT EXISTS event_journal_type_idx
--       ON <schema>.event_journal (bucket, event_type, campaign_id, seq);
-- (docs/operations.md, "Upgrading").
CREATE INDEX IF NOT EXISTS event_journal_type_idx
    ON event_journal (bucket, event_type, campaign_id, seq);
