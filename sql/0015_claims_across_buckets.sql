-- Claims across buckets on one server (issue 59): a worker's batch takes the campaigns due
-- first in the whole install, not in one bucket of 64, so a load spread over many campaigns
-- fills its batches. The claim reads the campaign queue in due order through this index (the
-- bucket's own, (bucket, due_at), serves the claims of one bucket, as on Citus).
CREATE INDEX projection_apply_campaigns_due_idx
    ON projection_apply_campaigns (due_at) WHERE NOT blocked;
