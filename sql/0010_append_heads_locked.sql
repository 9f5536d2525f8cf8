-- Append heads held by lock alone (issue 38): a campaign's head was one row updated by every
-- append (`last_seq`, the last allocated seq). Under a snapshot held elsewhere each update left
-- a version vacuum may not remove, and every probe of the head (the next append's, a batch's
-- hold of the heads, the sweep's) walked all of them: one per append, about 180,000 in fifteen
-- minutes at 200 events/s (docs/performance.md).
--
-- Now the row is the head's key alone, `campaign_head_keys`: made by a campaign's first
-- append, locked by every later one (a row lock writes no version), never updated by a
-- READ COMMITTED append. The campaign's last seq is the journal's: the append reads it after
-- the lock, in a statement of its own, one backward probe of the journal's primary key (the
-- journal is insert-only, so a held snapshot leaves nothing there to step over). The key's
-- own `last_seq` is the head when the row was made, a floor. `campaign_heads` is now a view
-- with the table's columns, for every reader. (docs/semantics.md, S28.)

ALTER TABLE campaign_heads RENAME TO campaign_head_keys;
ALTER INDEX campaign_heads_pkey RENAME TO campaign_head_keys_pkey;
ALTER TABLE campaign_head_keys
    RENAME CONSTRAINT campaign_heads_bucket_check TO campaign_head_keys_bucket_check;
ALTER TABLE campaign_head_keys
    RENAME CONSTRAINT campaign_heads_last_seq_check TO campaign_head_keys_last_seq_check;
-- Never updated now: no room kept for updates.
ALTER TABLE campaign_head_keys SET (fillfactor = 100);

-- Every campaign's head as the table read before: the greater of the key's floor and the
-- journal's last seq, and when that event was recorded. Each is a probe of the journal's
-- primary key, made only for the columns a query reads (a count of the heads reads none).
CREATE VIEW campaign_heads AS
SELECT k.campaign_id,
       greatest(k.last_seq, (
           SELECT max(e.seq) FROM event_journal e
           WHERE e.bucket = k.bucket AND e.campaign_id = k.campaign_id
       )) AS last_seq,
       coalesce((
           SELECT e.recorded_at FROM event_journal e
           WHERE e.bucket = k.bucket AND e.campaign_id = k.campaign_id
           ORDER BY e.seq DESC LIMIT 1
       ), k.updated_at) AS updated_at,
       k.bucket
FROM campaign_head_keys k;
