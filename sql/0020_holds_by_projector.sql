-- A projector's holds indexed by (projector, bucket, campaign_id, seq), their status carried in
-- the index, in place of (projector, status). Probes of a hold name its whole key (the append's
-- look for a group's hold, S35; the engine's probe of a projector's holds, S30); with the table
-- analyzed while it was small the planner took the (projector, status) index for them, which
-- reads every hold of the projector a probe at a time: a worker group's backlog made each
-- append scan it (as migration 0019 found for the checkpoint keys). With this index every
-- plan finds a hold by its whole key; the counts of a projector's holds by status (the report,
-- the console) read its first column and the status beside it, index only.
--
-- Built in the migration's transaction, which holds the holds' writes meanwhile; a table with
-- many holds can have it built beforehand (the migration then finds it):
--   CREATE INDEX CONCURRENTLY IF NOT EXISTS projection_holds_projector_key_idx
--       ON <schema>.projection_holds (projector, bucket, campaign_id, seq) INCLUDE (status);
CREATE INDEX IF NOT EXISTS projection_holds_projector_key_idx
    ON projection_holds (projector, bucket, campaign_id, seq) INCLUDE (status);
DROP INDEX projection_holds_projector_idx;
