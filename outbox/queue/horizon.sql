-- What keeps the queue's dead row versions alive: the oldest snapshot the server holds for
-- this database (`horizon.py`).

-- name: get_horizon_holder
-- The holder of the oldest xmin that vacuum of this database's tables must respect, the
-- calling session left out: a session (an open transaction or a statement's snapshot, here or
-- a physical standby's walsender under hot_standby_feedback: PostgreSQL 14 and later ignore
-- other databases' sessions for ordinary tables), a replication slot's xmin, or a prepared
-- transaction. Its kind, pid (sessions), name (application_name, slot name or gid), state,
-- age in transactions (`age(xmin)`) and seconds held (since its transaction or prepare
-- began; null where the server does not say, or shows another user's session without
-- pg_read_all_stats). None when nothing holds a snapshot.
SELECT h.kind, h.pid, h.name, h.state, h.xmin_age, h.held_seconds
FROM (
    SELECT 'session' AS kind, a.pid, a.application_name AS name, a.state,
           age(a.backend_xmin) AS xmin_age,
           extract(epoch FROM clock_timestamp() - a.xact_start)::double precision
               AS held_seconds
    FROM pg_stat_activity a
    WHERE a.backend_xmin IS NOT NULL AND a.pid <> pg_backend_pid()
      AND (a.datname = current_database() OR a.backend_type = 'walsender')
    UNION ALL
    SELECT 'replication slot', s.active_pid, s.slot_name::text,
           CASE WHEN s.active THEN 'active' ELSE 'inactive' END, age(s.xmin), NULL
    FROM pg_replication_slots s
    WHERE s.xmin IS NOT NULL
    UNION ALL
    SELECT 'prepared transaction', NULL, p.gid, 'prepared', age(p.transaction),
           extract(epoch FROM clock_timestamp() - p.prepared)::double precision
    FROM pg_prepared_xacts p
    WHERE p.database = current_database()
) h
ORDER BY h.xmin_age DESC, h.held_seconds DESC NULLS LAST
LIMIT 1
