-- Placing the outbox's tables on a Citus cluster (`maintenance distribute`).

-- name: get_citus_version
-- The Citus extension's version in this database; no row: not a Citus database.
SELECT extversion FROM pg_extension WHERE extname = 'citus'

-- name: get_citus_coordinator
-- Whether this node is the coordinator (false on a worker node).
SELECT citus_is_coordinator()

-- name: list_citus_tables
-- Every distributed or reference table of the install's schema: name, distribution column
-- (NULL for a reference table) and co-location group.
SELECT c.relname::text AS table_name,
       CASE WHEN p.partmethod = 'h' THEN column_to_column_name(p.logicalrelid, p.partkey) END
           AS column_name,
       p.colocationid AS colocation_id,
       (SELECT count(*) FROM pg_dist_shard s WHERE s.logicalrelid = p.logicalrelid) AS shards
FROM pg_dist_partition p
JOIN pg_class c ON c.oid = p.logicalrelid
WHERE c.relnamespace = '@extschema@'::regnamespace

-- name: count_citus_nodes
-- Active primary nodes that may hold shards.
SELECT count(*) FROM pg_dist_node
WHERE isactive AND noderole = 'primary' AND shouldhaveshards

-- name: create_distributed_table
-- Distribute the install's table $1 by column $2, co-located with its table $3 ('none': a
-- group of its own, of $4 shards; a table's name: that table's shards, $4 NULL). Existing rows
-- move to the shards.
SELECT create_distributed_table(
    ('@extschema@.' || $1::text)::regclass, $2::text,
    colocate_with => CASE WHEN $3::text = 'none' THEN 'none' ELSE '@extschema@.' || $3::text END,
    shard_count => $4::integer
)

-- name: reset_plans
-- The hot functions back to the default plans, which Citus can distribute (distribution_fn.sql); the
-- number of functions changed.
SELECT @extschema@.outbox_plans_for_citus()
