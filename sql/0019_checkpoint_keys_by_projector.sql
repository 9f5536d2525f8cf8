-- A projector's checkpoint keys indexed by (projector, bucket, campaign_id), not by projector
-- alone. Every probe of a key names all three; with the table analyzed while it was small (a
-- new install, a new projector) the planner took the narrower projector index for them, which
-- reads every key of the projector a probe at a time: a settle of a build's step onto 10,000
-- campaigns took 20-68 ms where it takes 1.5 (bench/sparse.py --profile). With this index both
-- of the table's indexes find a key by its whole key; reads of a projector's keys (its
-- retirement, the promotion's lag) use its first column as they used the old one.
--
-- Built in the migration's transaction, which holds the settles' new keys meanwhile. On a large
-- table, build it beforehand without holding them (the migration then finds it):
--   CREATE INDEX CONCURRENTLY IF NOT EXISTS projection_checkpoint_keys_projector_key_idx
--       ON <schema>.projection_checkpoint_keys (projector, bucket, campaign_id);
CREATE INDEX IF NOT EXISTS projection_checkpoint_keys_projector_key_idx
    ON projection_checkpoint_keys (projector, bucket, campaign_id);
DROP INDEX projection_checkpoint_keys_projector_idx;
