-- A projector's holds indexed by (projector, bucket, campaign_id, seq), their status carried in
-- the index, in place of (projector, status). Probes of a hold name its whole key, or its
-- projector, bucket and campaigns (the engine's probe of a projector's holds at seq 0 in a
-- step's campaigns, S30, S35); with the table analyzed while it was small, a generic plan took
-- the (projector, status) index for them and filtered the rest: every hold of the projector
-- read a probe at a time, as migration 0019 found for the checkpoint keys. With this index such
-- a plan reads the projector's holds in the bucket at most; the counts of a projector's holds by
-- status (the report, the console) read its first column and the status beside it, index only.
--
-- Built in the migration's transaction, which holds the holds' writes meanwhile; a table with
-- many holds can have it built beforehand (the migration then finds it):
--   CREATE INDEX CONCURRENTLY IF NOT EXISTS projection_holds_projector_key_idx
--       ON <schema>.projection_holds (projector, bucket, campaign_id, seq) INCLUDE (status);
CREATE INDEX IF NOT EXISTS projection_holds_projector_key_idx
    ON projection_holds (projector, bucket, campaign_id, seq) INCLUDE (status);
DROP INDEX projection_holds_projector_idx;
