-- The campaign queue's rotation (`rotation.py`; the function is rotation_fn.sql).

-- name: rotate_queue
-- One rotation of the campaign queue's slots: empty the oldest unless it is empty, busy or
-- holds more than $1 live rows, waiting at most $2 ms for its lock; at $3, or the clock when
-- null. Run in a transaction of its own: the emptied slot stays locked until it commits.
SELECT slot, outcome, moved
FROM @extschema@.outbox_rotate($1::integer, $2::integer, $3::timestamptz)
