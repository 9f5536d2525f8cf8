-- The settle's server functions (`settle.py`): the end of a batch in one call, and the
-- statement clock that the queue's writes call.
-- requires: buckets/distribution_fn.sql
-- requires: queue/claim_fn.sql
-- requires: queue/holds_fn.sql
-- requires: projection/guards_fn.sql
-- requires: projection/versions_fn.sql

-- The statement clock for writes that take an optional instant: `outbox_now(p)` is `p`, or the
-- statement's timestamp when `p` is null (the worker passes null; tests pass an instant). A
-- statement that writes a distributed table on Citus may call a stable function only with
-- constants and parameters (Citus evaluates it on the coordinator and routes the result), and
-- no function at all inside COALESCE or CASE; `coalesce($n, statement_timestamp())` breaks the
-- second rule, `outbox_now($n)` keeps both. PL/pgSQL, so that no planner inlines it back into a
-- COALESCE. On plain PostgreSQL it is the same instant.
CREATE OR REPLACE FUNCTION outbox_now(p_at timestamptz) RETURNS timestamptz
LANGUAGE plpgsql STABLE PARALLEL SAFE
SET search_path FROM CURRENT
AS $$
BEGIN
    RETURN coalesce(p_at, statement_timestamp());
END
$$;

-- The end of a batch in bucket `p_bucket` (-1: a batch that claimed across buckets on one
-- server; each campaign's rows in its own, `outbox_bucket_in`), in one call, its work in one
-- JSON document (`p_batch`), so that a field added later is a key old callers leave out, not
-- another copy of the function:
--   done         [{campaign_id, seq}]                            completed rows, deleted
--   failed       [{campaign_id, seq, attempts, delay, error, dead}] a row's own failures (no
--                                                                  projector to hold: S8)
--   holds        [{campaign_id, projector, seq, status, attempts, delay, error, event_type,
--                  from}]
--                                                                  holds placed (S24); with an
--                                                                  event type, its row is made
--                                                                  when it is not there
--   released     [{campaign_id, projector, seq, upto}]           holds gone; a row left with
--                                                                  no hold goes with them; with
--                                                                  `upto` (a group's hold, S35:
--                                                                  the checkpoint the batch left)
--                                                                  gone only under the append
--                                                                  head with nothing journaled
--                                                                  past `upto`, else kept due now
--   group        the worker group of the batch (S35): the projectors recorded in it are
--                 those it must know (absent: every one, a worker of a release before groups)
--   touched      [{campaign_id, seq}]                            rows whose holds changed: their
--                                                                  status, attempts, next attempt
--                                                                  and error follow their holds
--   campaigns    [{campaign_id, head_seq, due_at, delay, seen, blocked, gone}]
--                                                                  each held campaign's row
--   checkpoints  [{campaign_id, projector, applied_seq}]            moves, sorted (lock order)
--   projectors   the projectors the batch knew (it ran them, or left their share in holds):
--                 one the database records and this list lacks fails the call (OB024, which
--                 a worker treats as transient: the batch runs again, knowing it), and so
--                 does a superseded version in it (S29: it runs again without it), checked
--                 under the versions' lock (shared; a promotion takes it exclusive)
--   now          an instant (tests), or null: clock_timestamp(), read once before the writes
--   notify       with rows deleted, one NOTIFY on `channel` (payload: the bucket, '' across)
-- Citus routes the writes below to the batch's shard, reading their rows from the document
-- (`jsonb_to_recordset`), and refuses in them a stable expression over those rows: every
-- instant derived from a delay (a failure's or a hold's next attempt, a campaign's due time)
-- is worked out first, into the document, by a statement of the coordinator's own. Measured
-- against the 20 positional arrays it replaces (one warm connection, calls rolled back), the
-- call costs the same or less.
-- First statement: hold the append heads of the campaigns the batch left with nothing live
-- (`gone`) or waiting for holds alone (`seen`; outbox_lock_heads): an append that comes later
-- waits for the batch to commit, then finds the campaign row as the batch left it (and makes
-- it due now); one in flight keeps the campaign row, due now. Then the holds: released ones
-- deleted, placed ones written one by one (INSERT ... VALUES: Citus routes it to the shard),
-- and the touched rows' columns worked out from their holds (outbox_hold_rows). Then the
-- checkpoints move, one by one; then each campaign's rows and its campaign row, one statement
-- per campaign (below). The NOTIFY goes after the writes, from this session (readers waiting
-- for their writes look again). Returns how many campaigns are left due now, rows or holds to
-- take (the worker claims again instead of sleeping), and the seconds each deleted row waited
-- since it was enqueued.
CREATE OR REPLACE FUNCTION outbox_settle(
    p_bucket integer,
    p_batch jsonb,
    OUT due bigint, OUT ages double precision[]
)
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
SET enable_seqscan = off
SET plan_cache_mode = force_generic_plan
SET jit = off
AS $$
#variable_conflict use_column
DECLARE
    held text[] := '{}';
    v_now timestamptz := coalesce((p_batch ->> 'now')::timestamptz, clock_timestamp());
    gone text[];
    unknown text;
    stale text;
    -- The batch ran projectors or holds work for some: it checks them under the versions' lock.
    ran boolean := p_batch ? 'projectors'
                   OR jsonb_array_length(coalesce(p_batch -> 'holds', '[]')) > 0;
    failed jsonb := '[]';
    campaigns jsonb := '[]';
    m record;
    v_bucket integer;  -- the bucket of the campaign at hand (`outbox_bucket_in`)
    released jsonb := coalesce(p_batch -> 'released', '[]');
    owed jsonb;
    heads text[];
BEGIN
    IF ran THEN
        PERFORM outbox_lock_versions(false);
        -- One read of the record, under the versions' lock, for two refusals (OB024, transient:
        -- the batch runs again). `unknown`: a projector recorded since this worker last read
        -- the record (a rolling deploy), whose share of the batch was not left in holds; a
        -- superseded version is owed nothing (S29), so it is no such projector. `stale`: a
        -- version promoted past since this worker last read the versions, which the batch ran
        -- or held work for; the batch runs again without it.
        SELECT string_agg(k.projector, ', ' ORDER BY k.projector) FILTER (
                   WHERE p_batch ? 'projectors' AND p.transactional AND k.state <> 'superseded'
                     AND (NOT p_batch ? 'group' OR p.group_name = p_batch ->> 'group')
                     AND NOT k.projector = ANY (
                         ARRAY(SELECT jsonb_array_elements_text(p_batch -> 'projectors')))),
               string_agg(k.projector, ', ' ORDER BY k.projector) FILTER (
                   WHERE k.state = 'superseded' AND k.projector = ANY (
                       ARRAY(SELECT jsonb_array_elements_text(p_batch -> 'projectors')
                             UNION ALL
                             SELECT x ->> 'projector'
                             FROM jsonb_array_elements(coalesce(p_batch -> 'holds', '[]')) x)))
        INTO unknown, stale
        FROM outbox_projector_versions k
        JOIN outbox_projectors p ON p.projector = k.projector;
        IF unknown IS NOT NULL THEN
            RAISE EXCEPTION 'projector % is recorded and this batch did not know it: it runs '
                            'again', unknown
                USING ERRCODE = 'OB024';
        END IF;
        IF stale IS NOT NULL THEN
            RAISE EXCEPTION 'projector % is superseded by a promoted version and this batch '
                            'ran it or held work for it: it runs again without it', stale
                USING ERRCODE = 'OB024';
        END IF;
    END IF;
    gone := ARRAY(
        SELECT t.campaign_id
        FROM jsonb_to_recordset(p_batch -> 'campaigns')
            AS t(campaign_id text, gone boolean, seen bigint)
        WHERE t.gone OR t.seen IS NOT NULL
    );
    IF cardinality(gone) > 0 THEN
        SELECT coalesce(array_agg(h.campaign_id), '{}') INTO held
        FROM outbox_lock_heads(p_bucket, gone) h;
    END IF;
    IF jsonb_array_length(p_batch -> 'failed') > 0 THEN
        SELECT jsonb_agg(f.value || jsonb_build_object(
                   'next', v_now + make_interval(secs => (f.value ->> 'delay')::double precision))
                   ORDER BY f.ord)
        INTO failed
        FROM jsonb_array_elements(p_batch -> 'failed') WITH ORDINALITY AS f(value, ord);
    END IF;
    IF jsonb_array_length(p_batch -> 'campaigns') > 0 THEN
        SELECT jsonb_agg(c.value || jsonb_build_object('due', CASE
                   WHEN c.value ->> 'due_at' IS NULL AND c.value ->> 'delay' IS NULL THEN v_now
                   ELSE least((c.value ->> 'due_at')::timestamptz,
                              v_now + make_interval(secs => (c.value ->> 'delay')::double precision))
                   END)
                   ORDER BY c.ord)
        INTO campaigns
        FROM jsonb_array_elements(p_batch -> 'campaigns') WITH ORDINALITY AS c(value, ord);
    END IF;
    IF released @? '$[*].upto' THEN
        -- A group's holds its batch took to the journal's end (S35): an append holds a head
        -- it skips, or one committed before it held the head, is owed too. Those stay, due
        -- now, at the event after `upto`; an append that comes later finds none and writes one.
        SELECT coalesce(array_agg(h.campaign_id), '{}') INTO heads
        FROM outbox_lock_heads(p_bucket, ARRAY(
            SELECT DISTINCT r.campaign_id
            FROM jsonb_to_recordset(released) AS r(campaign_id text, upto bigint)
            WHERE r.upto IS NOT NULL)) h;
        SELECT coalesce(jsonb_agg(r.value) FILTER (WHERE r.owed), '[]'),
               coalesce(jsonb_agg(r.value) FILTER (WHERE NOT r.owed), '[]')
        INTO owed, released
        FROM (
            SELECT e.value, e.value ? 'upto' AND (
                       NOT (e.value ->> 'campaign_id') = ANY (heads) OR EXISTS (
                           SELECT 1 FROM event_journal j
                           WHERE j.bucket = outbox_bucket_in(p_bucket, e.value ->> 'campaign_id')
                             AND j.campaign_id = e.value ->> 'campaign_id'
                             AND j.seq > (e.value ->> 'upto')::bigint)) AS owed
            FROM jsonb_array_elements(released) AS e(value)
        ) r;
        UPDATE projection_holds h
        SET status = 'pending', attempt_count = 0, next_attempt_at = v_now, last_error = NULL,
            from_seq = r.upto + 1, updated_at = v_now
        FROM jsonb_to_recordset(owed) AS r(campaign_id text, projector text, seq bigint,
                                           upto bigint)
        WHERE h.bucket = outbox_bucket_in(p_bucket, r.campaign_id)
          AND h.campaign_id = r.campaign_id AND h.projector = r.projector AND h.seq = r.seq;
    END IF;
    IF jsonb_array_length(released) > 0 THEN
        DELETE FROM projection_holds h
        USING jsonb_to_recordset(released)
            AS r(campaign_id text, projector text, seq bigint)
        WHERE h.bucket = outbox_bucket_in(p_bucket, r.campaign_id)
          AND h.campaign_id = r.campaign_id AND h.projector = r.projector AND h.seq = r.seq;
    END IF;
    IF jsonb_array_length(coalesce(p_batch -> 'holds', '[]')) > 0 THEN
        FOR m IN
            SELECT x.campaign_id, x.projector, x.seq, x.status, x.attempts, x.error,
                   x.event_type, v_now + make_interval(secs => x.delay) AS next, x."from"
            FROM jsonb_to_recordset(p_batch -> 'holds')
                AS x(campaign_id text, projector text, seq bigint, status text, attempts integer,
                     delay double precision, error text, event_type text, "from" bigint)
            ORDER BY x.campaign_id, x.projector, x.seq
        LOOP
            v_bucket := outbox_bucket_in(p_bucket, m.campaign_id);
            IF m.event_type IS NOT NULL THEN
                -- A failure on an event whose row went (the projector met it in the journal):
                -- the row comes back, for its holder alone, so that readers and operators see
                -- it like any other.
                -- The batch holds the campaign, so no one else makes its rows meanwhile (S26:
                -- the look covers every slot).
                PERFORM FROM projection_apply_outbox o
                WHERE o.bucket = v_bucket AND o.campaign_id = m.campaign_id AND o.seq = m.seq;
                IF NOT FOUND THEN
                    INSERT INTO projection_apply_outbox (bucket, campaign_id, seq, event_type,
                                                         next_attempt_at, enqueued_at,
                                                         updated_at, slot)
                    VALUES (v_bucket, m.campaign_id, m.seq, m.event_type, m.next, v_now, v_now,
                            outbox_queue_slot(v_now));
                END IF;
            END IF;
            INSERT INTO projection_holds AS h (bucket, campaign_id, projector, seq, status,
                                               attempt_count, next_attempt_at, last_error,
                                               created_at, updated_at, from_seq)
            VALUES (v_bucket, m.campaign_id, m.projector, m.seq, m.status, m.attempts, m.next,
                    m.error, v_now, v_now, m."from")
            ON CONFLICT (bucket, campaign_id, projector, seq) DO UPDATE
            SET status = excluded.status, attempt_count = excluded.attempt_count,
                next_attempt_at = excluded.next_attempt_at,
                last_error = coalesce(excluded.last_error, h.last_error),
                updated_at = excluded.updated_at,
                from_seq = coalesce(excluded.from_seq, h.from_seq);
        END LOOP;
    END IF;
    IF jsonb_array_length(released) > 0 THEN
        -- A row that stood for holds alone goes with the last of them: its other projectors
        -- had applied it.
        DELETE FROM projection_apply_outbox o
        USING jsonb_to_recordset(released)
            AS r(campaign_id text, projector text, seq bigint)
        WHERE o.bucket = outbox_bucket_in(p_bucket, r.campaign_id)
          AND o.campaign_id = r.campaign_id AND o.seq = r.seq AND r.seq > 0
          AND o.status <> 'processing'
          AND NOT EXISTS (
              SELECT 1 FROM projection_holds h
              WHERE h.bucket = outbox_bucket_in(p_bucket, r.campaign_id)
                AND h.campaign_id = o.campaign_id AND h.seq = o.seq
          );
    END IF;
    IF jsonb_array_length(coalesce(p_batch -> 'touched', '[]')) > 0 THEN
        PERFORM outbox_hold_rows(
            p_bucket,
            ARRAY(SELECT t.campaign_id FROM jsonb_to_recordset(p_batch -> 'touched')
                      AS t(campaign_id text, seq bigint)),
            ARRAY(SELECT t.seq FROM jsonb_to_recordset(p_batch -> 'touched')
                      AS t(campaign_id text, seq bigint)),
            v_now);
    END IF;
    -- Checkpoints move, each by its whole key, by a new move (S27: the claim locked the keys
    -- there; a key not there yet, a campaign's first batch under an ordered projector, is
    -- made): in one statement on one server, one by one with Citus (outbox_move_checkpoints).
    IF jsonb_array_length(coalesce(p_batch -> 'checkpoints', '[]')) > 0 THEN
        PERFORM outbox_move_checkpoints(p_bucket, p_batch -> 'checkpoints', v_now);
    END IF;
    -- Then, campaign by campaign, one statement each, whose snapshot sees every append that
    -- committed before the heads were held: delete its completed rows; record its failures
    -- (attempts, status failed or dead, the next attempt at now + delay, the error); write its
    -- row: delete it when the batch left it nothing live, its head is held, and no row at or
    -- past head_seq (the first seq the batch did not see) exists now; else set its head,
    -- blocked flag and due time: the earliest of due_at and now + delay, now when neither is
    -- set; and due now whatever it would be when a row past `seen` (the last seq the claim
    -- read) exists now: an append that committed during the batch is not left waiting behind
    -- a hold's backoff. Every read and write names the campaign and its rows by their whole
    -- key, so each is an index probe whatever the statistics say: a set-wise join against
    -- the document was planned, on tables analyzed while small, as a hash join over the
    -- bucket's whole index range, which read every dead version a snapshot held elsewhere
    -- kept alive (docs/performance.md, issue 38).
    due := 0;
    FOR m IN  -- each array of the document read once, grouped by campaign
        SELECT x.campaign_id,
               coalesce(d.seqs, '{}') AS done_seqs,
               coalesce(f.seqs, '{}') AS failed_seqs,
               coalesce(f.rows, '[]') AS failed_rows,
               t.value AS target
        FROM (
            SELECT e.value ->> 'campaign_id' AS campaign_id
            FROM jsonb_array_elements((p_batch -> 'done') || failed || campaigns) AS e(value)
            GROUP BY 1
        ) x
        LEFT JOIN (
            SELECT e.value ->> 'campaign_id' AS campaign_id,
                   array_agg((e.value ->> 'seq')::bigint) AS seqs
            FROM jsonb_array_elements(p_batch -> 'done') AS e(value)
            GROUP BY 1
        ) d USING (campaign_id)
        LEFT JOIN (
            SELECT e.value ->> 'campaign_id' AS campaign_id,
                   array_agg((e.value ->> 'seq')::bigint) AS seqs, jsonb_agg(e.value) AS rows
            FROM jsonb_array_elements(failed) AS e(value)
            GROUP BY 1
        ) f USING (campaign_id)
        LEFT JOIN (
            SELECT DISTINCT ON (e.value ->> 'campaign_id')
                   e.value ->> 'campaign_id' AS campaign_id, e.value
            FROM jsonb_array_elements(campaigns) AS e(value)
            ORDER BY e.value ->> 'campaign_id'
        ) t USING (campaign_id)
        ORDER BY x.campaign_id
    LOOP
        v_bucket := outbox_bucket_in(p_bucket, m.campaign_id);
        WITH done AS (
            DELETE FROM projection_apply_outbox o
            WHERE o.bucket = v_bucket AND o.campaign_id = m.campaign_id
              AND o.seq = ANY (m.done_seqs)
            RETURNING extract(epoch FROM v_now - o.enqueued_at)::double precision AS age
        ), failures AS (  -- a data-modifying CTE runs whether or not it is read
            UPDATE projection_apply_outbox o
            SET status = CASE WHEN f.dead THEN 'dead' ELSE 'failed' END,
                attempt_count = f.attempts,
                next_attempt_at = f.next,
                last_error = f.error,
                updated_at = v_now
            FROM jsonb_to_recordset(m.failed_rows)
                AS f(seq bigint, attempts integer, next timestamptz, error text, dead boolean)
            WHERE o.bucket = v_bucket AND o.campaign_id = m.campaign_id
              AND o.seq = ANY (m.failed_seqs) AND o.seq = f.seq
            RETURNING o.seq
        ), target AS (
            SELECT t.head_seq, t.due, t.seen, t.blocked,
                   t.gone AND m.campaign_id = ANY (held) AS gone
            FROM jsonb_to_record(m.target)
                AS t(head_seq bigint, due timestamptz, seen bigint, blocked boolean, gone boolean)
            WHERE m.target IS NOT NULL
        ), rest AS (
            -- Whether a row at or past the head (the first seq the batch did not see) exists
            -- now.
            SELECT t.*, EXISTS (
                       SELECT 1 FROM projection_apply_outbox o
                       WHERE o.bucket = v_bucket AND o.campaign_id = m.campaign_id
                         AND o.seq >= t.head_seq
                   ) AS past_head
            FROM target t
        ), flags AS (
            SELECT t.head_seq, t.due, t.blocked, t.gone,
                   -- Left waiting for holds, it got a row the claim did not see, or an append
                   -- holds its head now.
                   t.seen IS NOT NULL AND (NOT m.campaign_id = ANY (held) OR EXISTS (
                       SELECT 1 FROM projection_apply_outbox o
                       WHERE o.bucket = v_bucket AND o.campaign_id = m.campaign_id
                         AND o.seq > t.seen
                   )) AS fresh,
                   -- Seen to its end, it has rows past what the batch saw after all: an
                   -- append committed before the heads were held.
                   t.gone AND t.past_head AS beyond,
                   -- Left waiting for holds alone, with no row at or past the head: its row
                   -- says so (head_seq 0), and only a batch that does background work takes
                   -- it (S25).
                   t.seen IS NOT NULL AND NOT t.past_head AS bare
            FROM rest t
        ), removed AS (
            DELETE FROM projection_apply_campaigns c
            USING flags t
            WHERE c.bucket = v_bucket AND c.campaign_id = m.campaign_id
              AND t.gone AND NOT t.beyond
        ), kept AS (
            -- The batch holds this row (its claim locked it): an update, no insert.
            UPDATE projection_apply_campaigns c
            SET head_seq = CASE WHEN t.bare THEN 0 ELSE t.head_seq END,
                due_at = CASE WHEN t.fresh THEN v_now ELSE t.due END,
                blocked = t.blocked,
                updated_at = v_now
            FROM flags t
            WHERE c.bucket = v_bucket AND c.campaign_id = m.campaign_id
              AND (NOT t.gone OR t.beyond)
            RETURNING c.head_seq, c.due_at, c.blocked
        )
        SELECT due + (SELECT count(*) FROM kept WHERE NOT kept.blocked AND kept.due_at <= v_now),
               ages || (SELECT array_agg(done.age) FROM done)  -- null while none was deleted
        INTO due, ages;
    END LOOP;
    IF (p_batch ->> 'notify')::boolean AND ages IS NOT NULL THEN
        PERFORM pg_notify(p_batch ->> 'channel',
                          CASE WHEN p_bucket >= 0 THEN p_bucket::text ELSE '' END);
    END IF;
END
$$;

-- Campaign rows (`p_campaigns`, all in bucket `p_bucket`) brought in line with their work rows
-- and holds (S24), for paths that change rows without a claim (requeue, reconcile, replay,
-- inline apply, a lease's end) and for campaigns a claim found behind the truth: the head is
-- the first live row (pending, failed, or processing under a lease: due when the lease
-- expires); due at the earliest of its first live row without holds and its holds that are
-- not dead; blocked when a row's own dead row (no hold stands for it) precedes that row (never
-- under park, `p_park`). With nothing live and no hold but dead ones, the row is deleted when
-- its append head is held (`p_gone`, see outbox_lock_heads), else kept due now with head 0.
-- Waits for a batch that holds one of them.
--
-- A campaign has at most one campaign row, in whichever slot (S26), and only a transaction
-- that holds the campaign's append head exclusively creates one (an append holds it FOR
-- UPDATE). So the campaigns with no row at all are looked for first, and their heads held
-- (FOR NO KEY UPDATE: appends and other refreshes wait, batches skip them) before the
-- statement that writes, whose snapshot sees any row an append made meanwhile. A campaign
-- that had a row when it was looked for and lost it before the write (a batch that held it
-- deleted it) is not left without one: the write says which campaigns got neither an update
-- nor a new row, and those go round again, their heads held.
CREATE OR REPLACE FUNCTION outbox_refresh_campaigns(
    p_bucket integer,
    p_campaigns text[],
    p_park boolean,
    p_gone text[]
) RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
SET enable_seqscan = off
SET plan_cache_mode = force_generic_plan
SET jit = off
AS $$
#variable_conflict use_column
DECLARE
    todo text[] := p_campaigns;
    lacking text[];
    missing text[];
    rounds integer := 0;
    -- The statement's instant as a value: Citus refuses a function inside COALESCE in a
    -- statement that writes a distributed table.
    v_now timestamptz := statement_timestamp();
BEGIN
    lacking := ARRAY(
        SELECT t.campaign_id FROM unnest(todo) AS t(campaign_id)
        WHERE NOT EXISTS (
            SELECT 1 FROM projection_apply_campaigns c
            WHERE c.bucket = p_bucket AND c.campaign_id = t.campaign_id
        )
    );
    LOOP
        IF cardinality(lacking) > 0 THEN
            PERFORM FROM (
                SELECT 1 FROM campaign_head_keys h
                WHERE h.bucket = p_bucket AND h.campaign_id = ANY (lacking)
                ORDER BY h.campaign_id
                FOR NO KEY UPDATE
            ) x;
        END IF;
        WITH state AS (
            SELECT t.campaign_id, h.seq, least(d.next_attempt_at, k.next) AS next_attempt_at,
                   k.next IS NOT NULL AS holding,
                   NOT p_park AND EXISTS (
                       SELECT 1 FROM projection_apply_outbox x
                       WHERE x.bucket = p_bucket AND x.campaign_id = t.campaign_id
                         AND x.seq < coalesce(d.seq, h.seq) AND x.status = 'dead'
                         AND NOT EXISTS (
                             SELECT 1 FROM projection_holds y
                             WHERE y.bucket = p_bucket AND y.campaign_id = x.campaign_id
                               AND y.seq = x.seq
                         )
                   ) AS blocked
            FROM unnest(todo) AS t(campaign_id)
            LEFT JOIN LATERAL (
                SELECT o.seq
                FROM projection_apply_outbox o
                WHERE o.bucket = p_bucket AND o.campaign_id = t.campaign_id
                  AND o.status IN ('pending', 'failed', 'processing')
                ORDER BY o.seq
                LIMIT 1
            ) h ON true
            LEFT JOIN LATERAL (
                SELECT o.seq, o.next_attempt_at
                FROM projection_apply_outbox o
                WHERE o.bucket = p_bucket AND o.campaign_id = t.campaign_id
                  AND o.status IN ('pending', 'failed', 'processing')
                  AND NOT EXISTS (
                      SELECT 1 FROM projection_holds y
                      WHERE y.bucket = p_bucket AND y.campaign_id = o.campaign_id
                        AND y.seq = o.seq
                  )
                ORDER BY o.seq
                LIMIT 1
            ) d ON true
            CROSS JOIN LATERAL (
                SELECT min(y.next_attempt_at) AS next
                FROM projection_holds y
                WHERE y.bucket = p_bucket AND y.campaign_id = t.campaign_id
                  AND y.status <> 'dead'
            ) k
        ), removed AS (
            DELETE FROM projection_apply_campaigns c
            USING state s
            WHERE c.bucket = p_bucket AND c.campaign_id = s.campaign_id AND s.seq IS NULL
              AND NOT s.holding AND s.campaign_id = ANY (p_gone)
        ), keep AS (
            SELECT s.* FROM state s
            WHERE s.seq IS NOT NULL OR s.holding OR NOT s.campaign_id = ANY (p_gone)
        ), kept AS (
            UPDATE projection_apply_campaigns c
            SET head_seq = coalesce(s.seq, 0),
                due_at = coalesce(s.next_attempt_at, v_now),
                blocked = coalesce(s.blocked, false),
                updated_at = v_now
            FROM keep s
            WHERE c.bucket = p_bucket AND c.campaign_id = s.campaign_id
            RETURNING c.campaign_id
        ), made AS (
            INSERT INTO projection_apply_campaigns (bucket, campaign_id, head_seq, due_at,
                                                    blocked, updated_at, slot)
            SELECT p_bucket, s.campaign_id, coalesce(s.seq, 0), coalesce(s.next_attempt_at, v_now),
                   coalesce(s.blocked, false), v_now, outbox_queue_slot(v_now)
            FROM keep s
            WHERE s.campaign_id = ANY (lacking)
              AND NOT EXISTS (
                  SELECT 1 FROM projection_apply_campaigns c
                  WHERE c.bucket = p_bucket AND c.campaign_id = s.campaign_id
              )
            ORDER BY s.campaign_id
            RETURNING campaign_id
        )
        SELECT coalesce(array_agg(k.campaign_id), '{}') INTO missing
        FROM keep k
        WHERE NOT EXISTS (SELECT 1 FROM kept WHERE kept.campaign_id = k.campaign_id)
          AND NOT EXISTS (SELECT 1 FROM made WHERE made.campaign_id = k.campaign_id);
        EXIT WHEN cardinality(missing) = 0;
        rounds := rounds + 1;
        IF rounds >= 5 THEN  -- rows that come and go under it: the caller runs again
            RAISE EXCEPTION 'the campaign rows of % changed under the refresh 5 times', missing
                USING ERRCODE = '40001';
        END IF;
        todo := missing;
        lacking := missing;
    END LOOP;
END
$$;

-- Back to the default plans on Citus (buckets/distribution_fn.sql).
SELECT outbox_plans_for_citus();
