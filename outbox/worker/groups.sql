-- A worker group's own statements (`groups.py`, S35).

-- name: get_snapshot_end
-- The first transaction id not yet begun as of now: every transaction below it that is still
-- running began before this statement.
SELECT pg_snapshot_xmax(pg_current_snapshot())::text

-- name: get_older_running
-- Whether a transaction below $1 (get_snapshot_end's) is still running.
SELECT pg_snapshot_xmin(pg_current_snapshot()) < $1::text::xid8
