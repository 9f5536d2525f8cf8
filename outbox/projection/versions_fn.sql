-- Projector versions' server functions (`versions.py`, S29): which version readers read, and
-- the lock that makes a promotion one step for the workers.

-- The live version of projector `p_projector` (its declared name), for a reader that is about
-- to read that version's read model: call it in the reader's transaction. A projector with no
-- live version recorded (no worker has run it yet) reads as version 1.
CREATE OR REPLACE FUNCTION outbox_live_version(p_projector text)
RETURNS integer
LANGUAGE sql STABLE
SET search_path FROM CURRENT
AS $$
    SELECT coalesce(
        (SELECT l.version FROM outbox_projector_live l WHERE l.projector = p_projector), 1)
$$;

-- The versions' lock, for this transaction: shared by every settle that applied or held
-- projectors (before it checks that none of them is superseded), exclusive by a promotion.
-- A promotion so waits for the batches that have settled and not yet committed, and the
-- batches that settle after it see the version it superseded: no batch that ran a superseded
-- version commits after the promotion, and none leaves it a hold. One lock per install (the
-- key names the schema). `p_lock_timeout_ms` (a promotion's): set for the rest of the
-- caller's transaction first, so a promotion never stalls the settles queued behind it for
-- longer.
CREATE OR REPLACE FUNCTION outbox_lock_versions(
    p_exclusive boolean,
    p_lock_timeout_ms integer DEFAULT NULL
)
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
AS $$
BEGIN
    IF p_lock_timeout_ms IS NOT NULL THEN
        PERFORM set_config('lock_timeout', p_lock_timeout_ms || 'ms', true);
    END IF;
    IF p_exclusive THEN
        PERFORM pg_advisory_xact_lock(hashtext(current_schema() || '.outbox_versions'));
    ELSE
        PERFORM pg_advisory_xact_lock_shared(hashtext(current_schema() || '.outbox_versions'));
    END IF;
END;
$$;
