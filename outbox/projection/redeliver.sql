-- A lease-mode projector's history given again (`redeliver.py`, S31).

-- name: list_replay_campaigns
-- The next $3 campaigns of bucket $1 after $2 (null: from the first), in key order, with
-- their heads: a replay's step (no checkpoint, no lock: it delivers outside any transaction).
SELECT h.campaign_id, h.last_seq
FROM @extschema@.campaign_heads h
WHERE h.bucket = $1::integer AND ($2::text IS NULL OR h.campaign_id > $2::text)
ORDER BY h.campaign_id
LIMIT $3::integer
