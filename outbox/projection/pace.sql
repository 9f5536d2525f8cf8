-- The live path's state as the catch-up engine reads it to yield to it (`pace.py`).

-- name: get_live_wait
-- How long the live path's oldest due campaign has waited, in seconds (0: none waits): the
-- campaigns with live rows (head_seq > 0), due and not blocked, their earliest due time read
-- from the queue's due-order index (S10). What the catch-up engine yields to (issue 60).
SELECT coalesce(extract(epoch FROM statement_timestamp() - min(c.due_at)), 0)::float8
FROM @extschema@.projection_apply_campaigns c
WHERE NOT c.blocked AND c.head_seq > 0 AND c.due_at <= statement_timestamp()
