-- Events that evolve (issue 62): each journaled event carries the version of its payload's
-- schema, 1 unless its writer says otherwise (`Event(..., version=N)`, the append function's
-- `"version"`). Every event journaled before this migration is version 1: the column's
-- default, which PostgreSQL adds without rewriting the table. The check is added unvalidated
-- and then validated, which reads the journal once without blocking appends.
ALTER TABLE event_journal ADD COLUMN version integer NOT NULL DEFAULT 1;
ALTER TABLE event_journal
    ADD CONSTRAINT event_journal_version_check CHECK (version >= 1) NOT VALID;
ALTER TABLE event_journal VALIDATE CONSTRAINT event_journal_version_check;
