-- Campaign queue: one row per campaign with claimable work, so an ordered claim never visits
-- work rows it cannot take (rows queued behind a failed, dead or busy head, the tail of a hot
-- campaign). The work rows stay the truth; a campaign row is an index of them:
--   head_seq  the campaign's first live (pending or failed) row; nothing live comes before it
--   due_at    when that row is due (earlier than the truth is harmless: a claim finds out)
--   blocked   a dead row precedes the head and the fleet runs dead_policy=block
-- Every inserted work row gets its campaign row (the trigger below); workers move and delete
-- campaign rows when they settle a batch; requeue, reconcile and replay refresh them.
CREATE TABLE projection_apply_campaigns (
    campaign_id text        PRIMARY KEY,
    head_seq    bigint      NOT NULL,
    due_at      timestamptz NOT NULL,
    blocked     boolean     NOT NULL DEFAULT false,
    updated_at  timestamptz NOT NULL DEFAULT clock_timestamp()
) WITH (
    -- Every batch updates or deletes its campaigns' rows: vacuum early, keep room for HOT.
    fillfactor = 70,
    autovacuum_vacuum_scale_factor = 0.01,
    autovacuum_vacuum_threshold = 1000,
    autovacuum_vacuum_cost_delay = 0,
    autovacuum_analyze_scale_factor = 0.02,
    autovacuum_analyze_threshold = 1000
);

-- The ordered claim reads this index from its start and stops at the first campaign not due
-- yet: blocked campaigns are not in it, so their backlog costs the claim nothing.
CREATE INDEX projection_apply_campaigns_claim_idx
    ON projection_apply_campaigns (due_at)
    WHERE NOT blocked;

-- Existing queues migrate in place: one campaign row per campaign with a live row.
INSERT INTO projection_apply_campaigns (campaign_id, head_seq, due_at, blocked)
SELECT DISTINCT ON (o.campaign_id) o.campaign_id, o.seq, o.next_attempt_at,
       EXISTS (
           SELECT 1 FROM projection_apply_outbox d
           WHERE d.campaign_id = o.campaign_id AND d.seq < o.seq
       )
FROM projection_apply_outbox o
WHERE o.status IN ('pending', 'failed')
ORDER BY o.campaign_id, o.seq;

-- Enqueueing (an append, reconcile, any INSERT) makes sure each campaign of the new rows has
-- its campaign row, without waiting for a worker that holds an existing one (DO NOTHING takes
-- no row lock). New rows go behind the existing ones, so an existing row stays true. A new
-- campaign row starts at the campaign's first outstanding row, not the first new one: rows
-- inserted with triggers off (session_replication_role = replica, a restore) may precede
-- them, and the claim steps over dead ones. The
-- workers are woken only when a campaign row is created: a campaign that already had one is
-- already known to them. At most one payload-free NOTIFY per statement.
CREATE FUNCTION projection_apply_enqueued() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    created integer;
BEGIN
    INSERT INTO projection_apply_campaigns (campaign_id, head_seq, due_at)
    SELECT n.campaign_id,
           (SELECT min(o.seq) FROM projection_apply_outbox o WHERE o.campaign_id = n.campaign_id),
           min(n.next_attempt_at)
    FROM enqueued n
    WHERE n.status IN ('pending', 'failed')
    GROUP BY n.campaign_id
    ORDER BY n.campaign_id
    ON CONFLICT (campaign_id) DO NOTHING;
    GET DIAGNOSTICS created = ROW_COUNT;
    IF created > 0 THEN
        PERFORM pg_notify('outbox_work', '');
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER projection_apply_outbox_enqueued
    AFTER INSERT ON projection_apply_outbox
    REFERENCING NEW TABLE AS enqueued
    FOR EACH STATEMENT EXECUTE FUNCTION projection_apply_enqueued();
