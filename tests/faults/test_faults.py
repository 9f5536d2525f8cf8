"""Fault scenarios against real `outbox-worker` processes and a real, restartable PostgreSQL.

Each scenario runs a fleet of workers while the generator appends, injects its faults, lets the
fleet drain, stops it with SIGTERM (exit 0 expected), and records one line: events, faults
injected, lost, applied twice, order violations, unplanned worker exits, stray (non-JSON) log
lines. Every count but events and faults must be zero. `FAULTS_SCALE` (default 1) scales the
number of faults.
"""

from __future__ import annotations

import random
import signal

import anyio
import asyncpg
import orjson
import pytest
from harness import (
    FAST,
    Fleet,
    Generator,
    campaigns,
    finish,
    kill_at_random,
    scaled,
    two_workers_under_load,
    wait_drained,
)

from helpers import queue_count, run_cli, wait_for
from outbox import Event, Settings, append, db
from outbox.testing.localpg import LocalCluster

# A scenario runs minutes of faults; a hang still fails it rather than the whole tier.
pytestmark = pytest.mark.timeout(900)

# Where in a batch a worker's backend is, by what pg_stat_activity shows of it.
# The settle: heads, deletes, failures, checkpoints and campaign rows in one call.
SETTLE = "query LIKE 'SELECT due, ages%'"
PHASES = {
    "claim": "state = 'active' AND query LIKE 'SELECT * FROM outbox_claim%'",
    "apply": "state = 'active' AND query LIKE 'INSERT INTO fault_applied%'",
    "in_transaction": f"state = 'idle in transaction' AND NOT {SETTLE}",
    "delete": f"state = 'active' AND {SETTLE}",
    "before_commit": f"(state = 'idle in transaction' AND {SETTLE}) "
    "OR (state = 'active' AND query = 'COMMIT')",
    "idle_in_pool": "state = 'idle'",
}


async def test_backends_terminated_in_every_phase_of_a_batch(
    pool: db.Pool, dsn: str, fleet: Fleet
) -> None:
    generator = two_workers_under_load(fleet, pool, dsn, "phase", 12, pause=0.1)
    target = scaled(650)
    per_phase = dict.fromkeys(PHASES, 0)
    admin = await asyncpg.connect(dsn)
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(generator.run)
            kills = 0
            phase_order = list(PHASES)
            while kills < target:
                phase = phase_order[kills % len(phase_order)]
                query = (
                    "SELECT count(pg_terminate_backend(pid)) FROM (SELECT pid FROM "
                    "pg_stat_activity WHERE application_name = 'outbox-worker' AND datname = "
                    f"current_database() AND ({PHASES[phase]}) LIMIT 1) t"
                )
                hit = False

                async def kill(query: str = query) -> bool:
                    nonlocal hit
                    hit = bool(await admin.fetchval(query))
                    return hit

                with anyio.move_on_after(2):  # a phase not met within 2 s is skipped
                    await wait_for(kill, within=3, interval=0.005)
                if hit:
                    per_phase[phase] += 1
                kills += 1  # a phase not met within 2 s still takes its turn
                fleet.check()
            generator.stop()
    finally:
        await admin.close()
    faults = sum(per_phase.values())
    assert faults >= target // 2, per_phase
    notes = " ".join(f"{k}={v}" for k, v in per_phase.items())
    await finish("terminate_in_phase", pool, fleet, generator, faults=faults, notes=notes)


async def test_postgres_restarts_while_appends_go_on_with_keys(
    pool: db.Pool, dsn: str, fleet: Fleet, cluster: LocalCluster
) -> None:
    generator = two_workers_under_load(fleet, pool, dsn, "restart", 8, pause=0.05)
    restarts = scaled(5)
    async with anyio.create_task_group() as tg:
        tg.start_soon(generator.run)
        for _ in range(restarts):
            await anyio.sleep(1.5)  # fault pacing: appends and batches run in between
            await anyio.to_thread.run_sync(cluster.restart)
            fleet.check()
        await anyio.sleep(1.5)
        generator.stop()
    notes = f"appends with unknown outcome, retried with their key: {generator.unknown_outcomes}"
    await finish("postgres_restart", pool, fleet, generator, faults=restarts, notes=notes)


async def test_workers_frozen_past_the_idle_timeout(pool: db.Pool, dsn: str, fleet: Fleet) -> None:
    settings = Settings(dsn=dsn)
    # Debug: failed attempts log at debug (dead-letters at warning); none may show up here.
    fleet.env |= FAST | {"OUTBOX_IDLE_IN_TRANSACTION_TIMEOUT": "0.5", "OUTBOX_LOG_LEVEL": "debug"}
    names = ["w1", "w2", "w3"]
    for name in names:
        fleet.start(name)
    generator = Generator(pool, settings, campaigns("frozen", 10), pause=0.05)
    stops = scaled(20)
    rng = random.Random(9)
    async with anyio.create_task_group() as tg:
        tg.start_soon(generator.run)
        for _ in range(stops):
            name = rng.choice(names)
            fleet.signal(name, signal.SIGSTOP)
            await anyio.sleep(1.0)  # the fault: frozen for twice the server's idle timeout
            fleet.signal(name, signal.SIGCONT)
            await anyio.sleep(0.3)
            fleet.check()
        generator.stop()
    failed = fleet.events("apply.failed")
    assert failed == 0, "a session the server ended was logged as a projector failure"
    await finish("sigstop_frozen_worker", pool, fleet, generator, faults=stops)


async def test_listen_connections_killed_again_and_again(
    pool: db.Pool, dsn: str, fleet: Fleet
) -> None:
    settings = Settings(dsn=dsn)
    fleet.env |= {"OUTBOX_POLL_INTERVAL": "0.5"}
    for name in ("w1", "w2"):
        fleet.start(name)
    generator = Generator(pool, settings, campaigns("listen", 6), pause=0.1)
    target = scaled(300)
    kills = 0
    admin = await asyncpg.connect(dsn)
    kill = (
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
        "WHERE application_name = 'outbox-listener' AND datname = current_database()"
    )

    async def killed() -> bool:
        nonlocal kills
        kills += int(await admin.fetchval(kill))
        return bool(kills >= target)

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(generator.run)
            # Kill every listener as soon as it shows: often while it is still connecting.
            await wait_for(killed, within=300, interval=0.005)
            generator.stop()
    finally:
        await admin.close()
    await finish("listen_killed", pool, fleet, generator, faults=kills)


# Written the way another client or a manual fix would: valid jsonb no float can hold, and a
# work row whose journal row is gone (the foreign key has to be switched off for that).
POISON = """
INSERT INTO outbox.campaign_head_keys (bucket, campaign_id, last_seq)
VALUES (outbox.outbox_bucket('poison-json'), 'poison-json', 1),
       (outbox.outbox_bucket('poison-missing'), 'poison-missing', 1);
INSERT INTO outbox.event_journal (bucket, campaign_id, seq, event_type, payload)
VALUES (outbox.outbox_bucket('poison-json'), 'poison-json', 1, 'step',
        '{"uid": "p", "i": 0, "v": 1e400}'::jsonb);
INSERT INTO outbox.projection_apply_outbox (bucket, campaign_id, seq, event_type)
VALUES (outbox.outbox_bucket('poison-json'), 'poison-json', 1, 'step');
SET session_replication_role = replica;
INSERT INTO outbox.projection_apply_outbox (bucket, campaign_id, seq, event_type)
VALUES (outbox.outbox_bucket('poison-missing'), 'poison-missing', 1, 'step');
SET session_replication_role = origin;
"""


async def _poison(policy: str, pool: db.Pool, dsn: str, fleet: Fleet) -> None:
    settings = Settings(dsn=dsn)
    await pool.execute(POISON)
    await append(pool, "poison-unknown", [Event("mystery", {})], settings=settings)
    followers: dict[str, list[str]] = {}
    for campaign in ("poison-json", "poison-missing", "poison-unknown"):
        uids = [f"{campaign}-{i}" for i in (1, 2)]
        followers[campaign] = uids
        await append(
            pool,
            campaign,
            [Event("step", {"uid": uid, "i": i}) for i, uid in enumerate(uids, start=1)],
            settings=settings,
        )
    fleet.env |= FAST | {
        "OUTBOX_DEAD_POLICY": policy,
        # The unknown type is poison here (a writer deployed before its projector), not skipped.
        "OUTBOX_UNSUBSCRIBED": "retry",
        "OUTBOX_MAX_ATTEMPTS": "2",
        "OUTBOX_BACKOFF_BASE": "0.05",
        "OUTBOX_BACKOFF_CAP": "0.1",
    }
    fleet.start("w1", "--concurrency", "2")
    generator = Generator(pool, settings, campaigns(f"good-{policy}", 8), pause=0.02)
    await generator.run(appends=10)

    async def poison_dead() -> bool:
        return await queue_count(pool, status="dead") == 3

    await wait_for(poison_dead, within=60)
    if policy == "park":  # the dead heads step aside: their followers are applied
        generator.expected |= followers
    # Under block, the poison campaigns' followers stay behind their dead heads.
    waiting = "poison-%" if policy == "block" else ""
    await finish(f"poison_rows_{policy}", pool, fleet, generator, faults=3, waiting=waiting)
    left = await pool.fetch(
        "SELECT campaign_id, seq, status FROM outbox.projection_apply_outbox ORDER BY 1, 2"
    )
    dead = [(r["campaign_id"], r["seq"]) for r in left if r["status"] == "dead"]
    assert dead == [("poison-json", 1), ("poison-missing", 1), ("poison-unknown", 1)]
    if policy == "block":  # the followers wait behind their dead heads, untouched
        assert len(left) == 9
    report = run_cli("maintenance", "outbox-report", "--status", "dead", "--json", dsn=dsn)
    assert report.returncode == 0, report.stderr
    errors = {r["campaign_id"]: r["last_error"] for r in orjson.loads(report.stdout)["rows"]}
    assert "cannot be decoded" in errors["poison-json"]
    assert "is missing" in errors["poison-missing"]
    assert "no projector subscribes to event type 'mystery'" in errors["poison-unknown"]


async def test_poison_rows_under_block(pool: db.Pool, dsn: str, fleet: Fleet) -> None:
    await _poison("block", pool, dsn, fleet)


async def test_poison_rows_under_park(pool: db.Pool, dsn: str, fleet: Fleet) -> None:
    await _poison("park", pool, dsn, fleet)


async def test_sigkill_soak_with_several_processes(pool: db.Pool, dsn: str, fleet: Fleet) -> None:
    await _soak("sigkill_soak", pool, dsn, fleet, kills=scaled(60))


async def test_sigkill_soak_with_a_batch_projector(pool: db.Pool, dsn: str, fleet: Fleet) -> None:
    fleet.app = "faults_app:batch_app"
    await _soak("sigkill_soak_batch", pool, dsn, fleet, kills=scaled(30))


async def test_sigkill_soak_with_sql_projectors(pool: db.Pool, dsn: str, fleet: Fleet) -> None:
    """The stock worker run from a projectors file: the witness (unguarded), `ledger`
    (ordered) and `marked` (markers) are SQL functions (faults_app.SCHEMA), each checked
    against the generator; their batches run in one call of the server."""
    fleet.app = "sql_projectors.toml"
    projectors = ("ledger", "marked")
    await _soak("sigkill_soak_sql", pool, dsn, fleet, kills=scaled(30), projectors=projectors)


async def test_sigkill_soak_in_lease_mode(pool: db.Pool, dsn: str, fleet: Fleet) -> None:
    """Every event has a non-transactional projector: workers die mid-lease, other workers
    reclaim after 2 s leases. The witness (transactional, applied in the fenced completion)
    must be exactly once and in order; the courier at least once and in order."""
    fleet.app = "faults_app:lease_app"
    fleet.env |= {"OUTBOX_LEASE_SECONDS": "2"}
    await _soak("sigkill_soak_lease", pool, dsn, fleet, kills=scaled(20), deliveries=True)


async def test_sigkill_soak_under_a_snapshot_held_elsewhere(
    pool: db.Pool, dsn: str, fleet: Fleet
) -> None:
    """Another session holds one REPEATABLE READ snapshot (a report's: it read the journal)
    from before the first append until the oracle has judged the drain: vacuum removes nothing
    the whole time, and the workers rotate the campaign queue's slots under it (S26) while
    they are SIGKILLed, mid-rotation too. At the end no campaign has two campaign rows
    (`finish`), and a slot was emptied by TRUNCATE (a new file) during the soak."""
    holder = await db.connect(dsn, server_settings={"application_name": "fault-report"})
    try:
        await holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        seen = await holder.fetchval("SELECT count(*) FROM outbox.event_journal")
        before = await pool.fetch(SLOT_FILES)
        # A kill every 1.5-4.5 s: the soak runs long enough for several rotations (a slot is
        # emptied two ten-second periods after it was written).
        await _soak("sigkill_soak_held_snapshot", pool, dsn, fleet, kills=scaled(20), pace=1.5)
        # Still the same snapshot: it saw none of the soak's events.
        assert await holder.fetchval("SELECT count(*) FROM outbox.event_journal") == seen
        assert await pool.fetchval("SELECT count(*) FROM outbox.event_journal") > seen
        assert await pool.fetch(SLOT_FILES) != before, "no slot was rotated under the snapshot"
    finally:
        await holder.close()


# The queue's slots and their files: TRUNCATE gives a slot a new one.
SLOT_FILES = """
SELECT c.relname, c.relfilenode FROM pg_class c JOIN pg_inherits i ON i.inhrelid = c.oid
WHERE i.inhparent IN ('outbox.projection_apply_campaigns'::regclass,
                      'outbox.projection_apply_outbox'::regclass)
ORDER BY 1
"""


async def _deliveries(pool: db.Pool, expected: dict[str, list[str]]) -> tuple[int, int, int]:
    """The courier's record: (lost, repeated, order violations). A repeat re-delivers an event
    already delivered (at-least-once); going back past it is a violation."""
    rows = await pool.fetch("SELECT campaign_id, uid, i FROM fault_delivered ORDER BY id")
    seen: dict[str, int] = {}
    last: dict[str, int] = {}
    violations = 0
    for r in rows:
        seen[r["uid"]] = seen.get(r["uid"], 0) + 1
        if r["i"] < last.get(r["campaign_id"], -1):
            violations += 1
        last[r["campaign_id"]] = max(r["i"], last.get(r["campaign_id"], -1))
    wanted = [uid for uids in expected.values() for uid in uids]
    lost = sum(1 for uid in wanted if uid not in seen)
    return lost, sum(n - 1 for n in seen.values()), violations


async def _soak(
    name: str,
    pool: db.Pool,
    dsn: str,
    fleet: Fleet,
    *,
    kills: int,
    deliveries: bool = False,
    pace: float = 0.2,
    projectors: tuple[str, ...] = (),
) -> None:
    settings = Settings(dsn=dsn)
    fleet.env |= FAST
    names = ["w1", "w2", "w3"]
    for worker in names:
        fleet.start(worker, "--concurrency", "2")
    generator = Generator(pool, settings, campaigns("soak", 12), pause=0.05)
    async with anyio.create_task_group() as tg:
        tg.start_soon(generator.run)
        await kill_at_random(fleet, names, random.Random(11), kills, pace=pace)
        generator.stop()
    if not deliveries:
        await finish(name, pool, fleet, generator, faults=kills, projectors=projectors)
        return
    fleet.check()
    await wait_drained(pool)
    lost, repeated, violations = await _deliveries(pool, generator.expected)
    await finish(
        name,
        pool,
        fleet,
        generator,
        faults=kills,
        notes=f"courier: lost={lost} redelivered={repeated} order_violations={violations}",
    )
    assert (lost, violations) == (0, 0)
