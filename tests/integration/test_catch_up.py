"""Where a new projector starts (S25): `beginning` catches up from the journal on its own, every
campaign of it, dormant ones too, while the other projectors go on; `now` starts at what the
queue holds. Oracles: the sums each test's own generator appended (`expected`), never what a
worker saw."""

from __future__ import annotations

import contextlib
import random
from collections import Counter

import anyio
import pytest

from helpers import ADD, SUMS, Clock, campaigns_in_one_bucket, run_cli, sums
from outbox import Event, Settings, append, db
from outbox.errors import ConfigError, NotFound, PermanentError, TransientBatchError
from outbox.model import Background, StoredEvent
from outbox.obs.metrics import Metrics
from outbox.ops.cleanup import cleanup
from outbox.ops.health import health
from outbox.ops.requeue import requeue_one
from outbox.projection import sweep
from outbox.projection.app import Outbox
from outbox.projection.guards import projector_lag
from outbox.projection.known import list_known, record
from outbox.projection.pauses import pause, resume
from outbox.projection.registry import Start
from outbox.worker import catch_ups
from outbox.worker.apply import LIVE_HEAL
from outbox.worker.batch import Worker
from outbox.worker.gauges import refresh_gauges
from outbox.worker.runtime import drain_now


def app_of(
    dsn: str, *names: str, start: Start | None = None, background: Background = "share"
) -> Outbox:
    """Ordered projectors adding each event's `n` into `sums` under their names; the last
    named one starts at `start` (None: its default)."""
    app = Outbox(Settings(dsn=dsn, batch_size=10, background=background))
    for i, name in enumerate(names):

        async def add(tx: db.Connection, event: StoredEvent, name: str = name) -> None:
            await tx.execute(ADD, name, event.campaign_id, event.payload["n"])

        last = i == len(names) - 1
        app.projector(name, events=["add"], start=start if last else None)(add)
    return app


async def seed_holds(pool: db.Pool, projector: str, campaigns: int = 500) -> int:
    """One step of the sweep in SQL: catch-up holds on the next `campaigns` campaigns behind
    (as workers from before the engine's catch-ups, or a batch, leave them); the holds placed."""
    seeded: int = await pool.fetchval(
        "SELECT seeded FROM outbox.outbox_sweep($1, $2, 1024)", projector, campaigns
    )
    return seeded


async def progress(pool: db.Pool, projector: str) -> sweep.CatchUp:
    [found] = [c for c in await sweep.catch_ups(pool) if c.projector == projector]
    return found


async def history(
    pool: db.Pool, settings: Settings, campaigns: list[str], rng: random.Random
) -> Counter[str]:
    """1 to 6 events on each campaign, in random order; what each campaign's sum must be."""
    expected: Counter[str] = Counter()
    for cid in rng.sample(campaigns, len(campaigns)):
        events = [Event("add", {"n": rng.randint(1, 9)}) for _ in range(rng.randint(1, 6))]
        await append(pool, cid, events, settings=settings)
        expected[cid] += sum(e.payload["n"] for e in events)
    return expected


async def dormant(
    pool: db.Pool, dsn: str, prefix: str, count: int, seed: int
) -> tuple[list[str], random.Random, Counter[str]]:
    """`count` campaigns named `prefix`NN with `history` (from `seed`) applied by `roster`
    alone: every campaign dormant, no work rows. The campaigns, the generator, the sums."""
    rng = random.Random(seed)
    campaigns = [f"{prefix}{i:02d}" for i in range(count)]
    old = app_of(dsn, "roster")
    expected = await history(pool, old.settings, campaigns, rng)
    await drain_now(old, pool)
    return campaigns, rng, expected


@pytest.fixture
def small_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    """The sweep's cursor crosses many chunks, and stops seeding at its bound."""
    monkeypatch.setattr(sweep, "CAMPAIGNS", 7)
    monkeypatch.setattr(sweep, "OUTSTANDING", 10)


@pytest.fixture
async def table(pool: db.Pool) -> None:
    await pool.execute(SUMS)


@pytest.mark.usefixtures("table", "small_steps")
async def test_a_new_projector_catches_up_on_every_campaign_and_the_others_apply_once(
    pool: db.Pool, dsn: str
) -> None:
    campaigns, rng, expected = await dormant(pool, dsn, "c", 40, seed=37)
    assert await pool.fetchval("SELECT count(*) FROM outbox.projection_apply_outbox") == 0
    new = app_of(dsn, "roster", "stats")
    # Appends while it deploys: some campaigns active, heals and sweep both at work.
    expected += await history(pool, new.settings, rng.sample(campaigns, 8), rng)
    counts = await drain_now(new, pool)
    assert await sums(pool, "stats") == expected
    assert await sums(pool, "roster") == expected
    assert counts.dead == counts.failed == 0
    assert await pool.fetchval("SELECT count(*) FROM outbox.projection_holds") == 0
    assert await pool.fetchval("SELECT count(*) FROM outbox.projection_apply_outbox") == 0
    stats = await progress(pool, "stats")
    assert stats.swept_at is not None
    assert not stats.catching_up
    # The engine caught it up (S30), run by the worker: its build is recorded complete.
    build = await pool.fetchrow(
        "SELECT kind, state FROM outbox.outbox_builds WHERE projector = 'stats'"
    )
    assert build is not None
    assert tuple(build) == ("catch-up", "complete")
    heads = await pool.fetch(
        "SELECT h.last_seq, k.applied_seq FROM outbox.campaign_heads h "
        "JOIN outbox.projection_checkpoints k USING (bucket, campaign_id) "
        "WHERE k.projector = 'stats'"
    )
    assert len(heads) == len(campaigns)
    assert all(r["last_seq"] == r["applied_seq"] for r in heads)


@pytest.mark.usefixtures("table", "small_steps")
async def test_an_unordered_projector_catches_up_through_its_markers(
    pool: db.Pool, dsn: str
) -> None:
    campaigns, rng, expected = await dormant(pool, dsn, "m", 30, seed=38)
    new = app_of(dsn, "roster")
    # A backlog when it deploys: rows that its live path and its catch-up both meet.
    expected += await history(pool, new.settings, rng.sample(campaigns, 10), rng)
    failed: list[str] = []
    fixed: list[bool] = []

    async def add(tx: db.Connection, event: StoredEvent) -> None:
        # The first campaign met at seq 2 fails there until fixed, however the batch that
        # meets it is cut (a first pass and its careful rerun, S6, or a careful pass alone): a
        # hold of its own on that event alone, which leaves the campaign's later rows going.
        if event.seq == 2 and not fixed and event.campaign_id in (failed or [event.campaign_id]):
            failed[:] = [event.campaign_id]
            raise PermanentError("flaky")
        await tx.execute(ADD, "marked", event.campaign_id, event.payload["n"])

    new.projector("marked", events=["add"], ordered=False, idempotent=True, start="beginning")(add)
    await record(pool, new.registry, "deploy")
    worker = Worker(new, pool)
    for _ in range(6):  # appends between the batches: live rows inside the catch-up's range
        await worker.run_once()
        expected += await history(pool, new.settings, rng.sample(campaigns, 2), rng)
    await drain_now(new, pool)
    assert failed
    assert await sums(pool, "roster") == expected
    holds = await pool.fetch("SELECT campaign_id, seq, status FROM outbox.projection_holds")
    assert [tuple(h) for h in holds] == [(failed[0], 2, "dead")]  # that event alone
    fixed.append(True)
    await requeue_one(pool, failed[0], 2, projector="marked")  # retried for it alone
    counts = await drain_now(new, pool)
    assert counts.dead == counts.failed == 0
    assert await sums(pool, "marked") == expected
    assert await sums(pool, "roster") == expected
    assert await pool.fetchval("SELECT count(*) FROM outbox.projection_holds") == 0
    assert await pool.fetchval("SELECT count(*) FROM outbox.projection_apply_outbox") == 0
    assert not (await progress(pool, "marked")).catching_up


async def test_cleanup_keeps_the_markers_of_a_projector_catching_up(
    pool: db.Pool, dsn: str
) -> None:
    app = Outbox(Settings(dsn=dsn))

    async def nothing(tx: db.Connection, event: StoredEvent) -> None:
        return None

    app.projector("late", events=["a"], ordered=False, idempotent=True, start="beginning")(nothing)
    app.projector("steady", events=["a"], ordered=False, idempotent=True)(nothing)
    await append(pool, "k1", [Event("a", {})], settings=app.settings)
    await record(pool, app.registry, "deploy")  # `late` sweeps: its markers are kept
    for handler in ("late", "steady"):
        await pool.execute(
            "INSERT INTO outbox.processed_markers (bucket, campaign_id, seq, handler, "
            "applied_at) VALUES (outbox.outbox_bucket('k1'), 'k1', 1, $1, now() - '2 days'::"
            "interval)",
            handler,
        )
    removed = await cleanup(pool, markers_retention_hours=24)
    assert removed.removed.processed_markers == 1
    left = await pool.fetch("SELECT handler FROM outbox.processed_markers")
    assert [r["handler"] for r in left] == ["late"]
    await drain_now(app, pool)  # caught up: its markers age out like any others
    await pool.execute(
        "UPDATE outbox.processed_markers SET applied_at = now() - '2 days'::interval"
    )
    await cleanup(pool, markers_retention_hours=24)
    assert await pool.fetchval("SELECT count(*) FROM outbox.processed_markers") == 0


@pytest.mark.usefixtures("table")
async def test_catch_up_progress_is_reported_and_resumes_from_the_checkpoints(
    pool: db.Pool, dsn: str
) -> None:
    _, _, expected = await dormant(pool, dsn, "d", 12, seed=7)
    new = app_of(dsn, "roster", "stats")
    await record(pool, new.registry, "deploy")
    before = await progress(pool, "stats")
    total = await pool.fetchval("SELECT sum(last_seq) FROM outbox.campaign_heads")
    assert (before.campaigns, before.done, before.events_behind) == (12, 0, total)
    assert before.catching_up
    assert before.swept_at is None
    # Catch-up holds on five campaigns (as a worker from before the engine's catch-ups left
    # them), one batch applied, five more holds, then the worker stops (a SIGKILL's effect:
    # whatever it committed stays, the rest waits in holds).
    worker = Worker(new, pool)
    assert await seed_holds(pool, "stats", 5) == 5
    assert (await worker.run_once()).applied > 0
    assert await seed_holds(pool, "stats", 5) == 5
    during = await progress(pool, "stats")
    assert during.catching_up
    assert during.holds > 0
    assert during.done is not None
    assert during.events_behind is not None
    assert 0 < during.events_behind < total
    # The worker's series say the same.
    metrics = Metrics()
    await refresh_gauges(metrics, pool, park=False, ordered={"stats": {"add"}})
    sample = metrics.registry.get_sample_value
    assert sample("outbox_projector_events_behind", {"projector": "stats"}) == (
        during.events_behind
    )
    assert sample("outbox_projector_catching_up_campaigns", {"projector": "stats"}) == (
        during.holds
    )
    oldest = sample("outbox_projector_oldest_unapplied_seconds", {"projector": "stats"})
    assert oldest is not None
    assert oldest > 0
    # Another worker takes over: the holds go on from the checkpoints, nothing twice.
    await drain_now(new, pool)
    assert await sums(pool, "stats") == expected
    after = await progress(pool, "stats")
    assert not after.catching_up
    assert after.events_behind is None


@pytest.mark.usefixtures("table")
async def test_a_dormant_campaign_the_engine_cannot_apply_is_left_to_the_workers_holds(
    pool: db.Pool, dsn: str
) -> None:
    """The engine leaves a campaign whose event fails where its checkpoint stands, with a
    catch-up hold: the workers' batches count its attempts, dead-letter it, and a requeue after
    the fix takes it on; the other campaigns and projectors are exact throughout."""
    campaigns, _, expected = await dormant(pool, dsn, "f", 10, seed=61)
    sick = campaigns[3]
    fixed: list[bool] = []
    new = app_of(dsn, "roster")

    async def add(tx: db.Connection, event: StoredEvent) -> None:
        if event.campaign_id == sick and event.seq == 1 and not fixed:
            raise RuntimeError("not yet")
        await tx.execute(ADD, "stats", event.campaign_id, event.payload["n"])

    new.projector("stats", events=["add"], start="beginning")(add)
    await record(pool, new.registry, "deploy")
    await Worker(new, pool).drain()
    healthy = Counter({c: n for c, n in expected.items() if c != sick})
    assert await sums(pool, "stats") == healthy
    assert await sums(pool, "roster") == expected
    hold = await pool.fetchrow(
        "SELECT campaign_id, seq, status, attempt_count FROM outbox.projection_holds"
    )
    assert hold is not None
    # At the event it fails on now, the workers' first try (the engine charges none).
    assert (hold["campaign_id"], hold["seq"], hold["status"]) == (sick, 1, "failed")
    assert hold["attempt_count"] == 1
    clock = Clock()
    worker = Worker(new, pool, now=clock)
    for _ in range(new.settings.max_attempts):  # each retry as it falls due, until dead
        clock.advance(3600.0)
        await worker.drain()
    assert await pool.fetchval("SELECT status FROM outbox.projection_holds") == "dead"
    assert await sums(pool, "stats") == healthy
    fixed.append(True)
    await requeue_one(pool, sick, 1, projector="stats")
    await worker.drain()
    assert await sums(pool, "stats") == expected
    assert await sums(pool, "roster") == expected
    assert await pool.fetchval("SELECT count(*) FROM outbox.projection_holds") == 0
    assert not (await progress(pool, "stats")).catching_up


@pytest.mark.usefixtures("table")
async def test_a_pause_stops_the_engines_catch_up_and_a_resume_finishes_it(
    pool: db.Pool, dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A projector paused while the engine catches it up: the step in flight rolls back, the
    build stops, the drain ends without it; resumed, the next drain finishes it exactly."""
    monkeypatch.setattr(catch_ups, "RETRY", 0.01)
    _, _, expected = await dormant(pool, dsn, "p", 8, seed=63)
    entered, paused = anyio.Event(), list[bool]()
    new = app_of(dsn, "roster")

    async def add(tx: db.Connection, event: StoredEvent) -> None:
        if not paused:  # the first step waits here until the pause cancels it
            entered.set()
            await anyio.sleep_forever()
        await tx.execute(ADD, "stats", event.campaign_id, event.payload["n"])

    new.projector("stats", events=["add"], start="beginning")(add)
    await record(pool, new.registry, "deploy")
    with anyio.fail_after(60):  # unpaused, the step would wait for ever
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(Worker(new, pool).drain)
            await entered.wait()
            await pause(pool, "stats", actor="test", reason="mid-build")
            # The drain ends: the watcher saw the pause and stopped the build.
    assert await sums(pool, "stats") == Counter()
    build = await pool.fetchrow(
        "SELECT kind, state FROM outbox.outbox_builds WHERE projector = 'stats'"
    )
    assert build is not None
    assert tuple(build) == ("catch-up", "stopped")
    assert (await progress(pool, "stats")).swept_at is None
    paused.append(True)
    await resume(pool, "stats", actor="test", reason="fixed")
    await Worker(new, pool).drain()
    assert await sums(pool, "stats") == expected
    assert (await progress(pool, "stats")).swept_at is not None


@pytest.mark.usefixtures("table")
async def test_a_projector_that_starts_now_takes_no_history(pool: db.Pool, dsn: str) -> None:
    old = app_of(dsn, "roster")
    settings = old.settings
    for cid in ("e1", "e2", "e3"):
        await append(pool, cid, [Event("add", {"n": 5}), Event("add", {"n": 6})], settings=settings)
    await drain_now(old, pool)
    new = app_of(dsn, "roster", "fresh", start="now")
    await append(pool, "e1", [Event("add", {"n": 1}), Event("add", {"n": 2})], settings=settings)
    await drain_now(new, pool)
    assert await sums(pool, "fresh") == Counter({"e1": 3})
    assert await sums(pool, "roster") == Counter({"e1": 14, "e2": 11, "e3": 11})
    [fresh] = [k for k in await list_known(pool) if k.projector == "fresh"]
    assert fresh.start == "now"
    assert [c.projector for c in await sweep.catch_ups(pool)] == ["roster"]
    # Its checkpoint was put before the first event it met, then moved past what it applied.
    assert (
        await pool.fetchval(
            "SELECT applied_seq FROM outbox.projection_checkpoints "
            "WHERE projector = 'fresh' AND campaign_id = 'e1'"
        )
        == 4
    )


@pytest.mark.usefixtures("table")
async def test_a_projector_that_starts_now_gets_what_old_workers_left_it_and_no_history(
    pool: db.Pool, dsn: str
) -> None:
    old = app_of(dsn, "roster")
    new = app_of(dsn, "roster", "fresh", start="now")
    for cid in ("r1", "r2"):
        await append(pool, cid, [Event("add", {"n": 1})] * 2, settings=old.settings)
    await drain_now(old, pool)
    await record(pool, new.registry, "new-worker")  # a rolling deploy: old workers still run
    for cid in ("r1", "r2"):
        await append(pool, cid, [Event("add", {"n": 10})] * 2, settings=old.settings)
    worker = Worker(old, pool)
    # One that read the record before `fresh` was in it keeps nothing and reads it again.
    with contextlib.suppress(TransientBatchError):
        await worker.drain()
    await worker.drain()  # `fresh`'s share in holds, at the first event it owes
    assert await sums(pool, "roster") == Counter({"r1": 22, "r2": 22})
    assert await pool.fetchval("SELECT count(*) FROM outbox.projection_apply_outbox") == 0
    clock = Clock()
    clock.advance(3600.0)  # past the poll interval the old worker left the holds for
    await Worker(new, pool, now=clock).drain()
    assert await sums(pool, "fresh") == Counter({"r1": 20, "r2": 20})  # what came after it
    assert await sums(pool, "roster") == Counter({"r1": 22, "r2": 22})
    assert await pool.fetchval("SELECT count(*) FROM outbox.projection_holds") == 0


def test_start_is_checked_when_a_projector_is_registered() -> None:
    app = Outbox(Settings(dsn="postgresql://localhost/x"))

    async def nothing(tx: db.Connection, event: StoredEvent) -> None:
        return None

    with pytest.raises(ConfigError, match="start='beginning' catches up from the journal"):
        app.projector("u", events=["a"], ordered=False, start="beginning")(nothing)
    # An unordered projector catches up with its markers as the guard, through the campaigns.
    app.projector("m", events=["a"], ordered=False, idempotent=True, start="beginning")(nothing)
    with pytest.raises(ConfigError, match="OUTBOX_ORDERING=none cannot catch up projectors"):
        app.registry.validate(Settings(dsn="postgresql://localhost/x", ordering="none"))
    del app.registry.projectors["m"]
    with pytest.raises(ConfigError, match="start='beginning'"):
        app.projector("l", events=["a"], transactional=False, start="beginning")(nothing)
    with pytest.raises(ConfigError, match="start must be 'beginning' or 'now', not 'later'"):
        app.projector("x", events=["a"], start="later")(nothing)  # type: ignore[arg-type]
    app.projector("lease", events=["a"], transactional=False)(nothing)
    app.projector("ordered", events=["a"])(nothing)
    app.projector("unordered", events=["a"], ordered=False, idempotent=True)(nothing)
    starts = {p.name: p.start for p in app.registry.projectors.values()}
    assert starts == {"lease": "now", "ordered": "beginning", "unordered": "now"}


@pytest.mark.usefixtures("table")
async def test_health_names_a_stalled_projector_and_no_idle_one(pool: db.Pool, dsn: str) -> None:
    app = app_of(dsn, "roster", "stats")
    await append(pool, "h1", [Event("add", {"n": 1})], settings=app.settings)
    await drain_now(app, pool)
    idle = await health(pool, projector="stats", max_lag=1.0)
    assert idle.healthy, idle.reasons
    assert idle.projector is not None
    assert (idle.projector.lag_seconds, idle.projector.dead) == (0.0, 0)
    with pytest.raises(NotFound, match=r"'nope' is not recorded \(recorded: roster, stats\)"):
        await health(pool, projector="nope")
    # A worker of the previous release (no `stats`) applies the next event and leaves its
    # share in a hold; no worker that runs `stats` comes for two minutes.
    await append(pool, "h1", [Event("add", {"n": 2})], settings=app.settings)
    await drain_now(app_of(dsn, "roster"), pool)
    ago = await pool.fetchval("SELECT clock_timestamp() - interval '2 minutes'")
    await pool.execute(  # (a value, not an expression: Citus routes the update)
        "UPDATE outbox.projection_holds SET updated_at = $1, next_attempt_at = $1", ago
    )
    stalled = await health(pool, projector="stats", max_lag=60.0)
    assert not stalled.healthy
    assert stalled.projector is not None
    assert stalled.projector.lag_seconds >= 120
    assert any(
        "'stats' is stalled: a due hold of it has not been worked" in r for r in stalled.reasons
    )
    assert (await health(pool, projector="roster", max_lag=60.0)).healthy
    await pause(pool, "stats", actor="test", reason="looking")
    paused = await health(pool, projector="stats", max_lag=60.0)
    assert [r for r in paused.reasons if "stats" in r] == [
        "projector 'stats' is paused (maintenance projector-resume)"
    ]
    bare = run_cli("maintenance", "health", "--max-lag", "5", dsn=dsn)
    assert bare.returncode != 0
    assert "--max-lag judges a projector: name it with --projector" in bare.stderr
    named = run_cli("maintenance", "health", "--projector", "roster", "--json", dsn=dsn)
    assert named.returncode == 0, named.stderr


@pytest.mark.usefixtures("table")
async def test_appends_are_served_first_and_a_long_catch_up_waits_for_the_background(
    pool: db.Pool, dsn: str
) -> None:
    c1, c2, c3 = campaigns_in_one_bucket(3, prefix="live")
    old = app_of(dsn, "roster")
    history = [Event("add", {"n": 1})] * (LIVE_HEAL + 10)
    for cid in (c1, c2, c3):
        await append(pool, cid, history, settings=old.settings)
    await drain_now(old, pool)
    new = app_of(dsn, "roster", "stats")
    await record(pool, new.registry, "deploy")
    worker = Worker(new, pool)
    await seed_holds(pool, "stats")  # c1, c2, c3 dormant: catch-up holds
    await pool.execute("DELETE FROM outbox.projection_holds WHERE campaign_id = $1", c1)
    await pool.execute("DELETE FROM outbox.projection_apply_campaigns WHERE campaign_id = $1", c1)
    await append(pool, c1, [Event("add", {"n": 100})], settings=new.settings)
    bucket = await pool.fetchval("SELECT outbox.outbox_bucket($1)", c1)
    worker.ring.wake(str(bucket))  # the append's NOTIFY: served first, no background work
    counts = await worker.run_once()
    assert (counts.claimed, counts.applied) == (1, 1)
    assert await sums(pool, "roster") == Counter({c1: 130, c2: 30, c3: 30})
    assert await sums(pool, "stats") == Counter()  # 30 behind c1: not healed in this batch
    holds = await pool.fetch(
        "SELECT campaign_id, seq, status FROM outbox.projection_holds "
        "WHERE projector = 'stats' ORDER BY campaign_id"
    )
    assert [tuple(h) for h in holds] == [(c, 0, "pending") for c in sorted((c1, c2, c3))]
    await drain_now(new, pool)  # the background takes them on
    assert await sums(pool, "stats") == Counter({c1: 130, c2: 30, c3: 30})
    assert await sums(pool, "roster") == Counter({c1: 130, c2: 30, c3: 30})


@pytest.mark.usefixtures("table")
async def test_a_catch_up_worker_and_an_appends_worker_split_the_work(
    pool: db.Pool, dsn: str
) -> None:
    c1, c2 = campaigns_in_one_bucket(2, prefix="split")
    old = app_of(dsn, "roster")
    for cid in (c1, c2):
        await append(pool, cid, [Event("add", {"n": 2})] * 3, settings=old.settings)
    await drain_now(old, pool)
    new = app_of(dsn, "roster", "stats")
    await record(pool, new.registry, "deploy")
    await seed_holds(pool, "stats")  # both dormant: catch-up holds
    await append(pool, c1, [Event("add", {"n": 5})], settings=new.settings)
    appends = Worker(app_of(dsn, "roster", "stats", background="never"), pool)
    assert (await appends.run_once()).claimed == 1  # c1's row, not c2's catch-up
    assert await sums(pool, "roster") == Counter({c1: 11, c2: 6})
    assert await sums(pool, "stats") == Counter()
    catch_up = Worker(app_of(dsn, "roster", "stats", background="only"), pool)
    for _ in range(10):  # the holds alone, until none is left
        if not (await catch_up.run_once()).claimed:
            break
    assert await pool.fetchval("SELECT count(*) FROM outbox.projection_holds") == 0
    assert await sums(pool, "stats") == Counter({c1: 11, c2: 6})
    assert await sums(pool, "roster") == Counter({c1: 11, c2: 6})


@pytest.mark.usefixtures("table")
async def test_a_new_projector_touches_only_the_campaigns_holding_its_types(
    pool: db.Pool, dsn: str
) -> None:
    """A sweep gives catch-up holds only where the journal holds an event of the projector's
    types: a campaign of other types owes it nothing, and a hold there would cost a batch."""
    campaigns, _, expected = await dormant(pool, dsn, "t", 6, seed=58)
    others = [f"o{i:02d}" for i in range(20)]  # dormant campaigns of another type only
    settings = Settings(dsn=dsn)
    for cid in others:
        await append(pool, cid, [Event("other", {"n": 1})] * 3, settings=settings)
    old = app_of(dsn, "roster")
    old.ignore(["other"])
    await drain_now(old, pool)
    new = app_of(dsn, "roster", "stats", start="beginning")
    new.ignore(["other"])
    await record(pool, new.registry, "new-worker")
    stepped = await pool.fetchrow("SELECT * FROM outbox.outbox_sweep('stats', 500, 1024)")
    assert stepped is not None
    assert tuple(stepped) == (len(campaigns), len(campaigns) + len(others), True)
    held = {r[0] for r in await pool.fetch("SELECT campaign_id FROM outbox.projection_holds")}
    assert held == set(campaigns)
    await drain_now(new, pool)
    assert await sums(pool, "stats") == expected
    async with db.acquire(pool) as conn:
        assert (await projector_lag(conn, "stats", ["add"])).events_behind == 0
