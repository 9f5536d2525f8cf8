"""The catch-up engine (S30): a version built from the journal bucket by bucket, resumable
after a kill, beside live appends and workers, skipping what batches hold. Oracles: the sums
each test's generator appended, per campaign and per event (`expected`, `prefix`), never what
the engine saw."""

from __future__ import annotations

import os
import random
import signal
import subprocess
from collections import Counter
from collections.abc import Callable

import anyio
import orjson
import pytest
from worker_apps import tally

from helpers import BIN, EXAMPLES, SUMS, TESTS, run_cli, sums
from outbox import Event, Settings, append, db
from outbox.errors import ConfigError
from outbox.ops.versions import promote_version
from outbox.projection import build as engine
from outbox.projection.app import Outbox
from outbox.projection.build import build, planned
from outbox.projection.builds import Part, Progress, Throttle, list_builds
from outbox.projection.pace import LivePace
from outbox.projection.rebuild import versioned
from outbox.worker.runtime import drain_now

Journal = dict[str, list[int]]  # campaign -> each event's n, in seq order


def app_of(dsn: str, *, failing: str | None = None) -> Outbox:
    """`tally` v1 and v2 (tests/worker_apps.py); v2 fails on campaign `failing`."""
    app = Outbox(Settings(dsn=dsn, batch_size=10))

    async def v2(tx: db.Connection, events: object) -> None:
        if failing is not None and failing in events.campaign_ids:  # type: ignore[attr-defined]
            raise RuntimeError("tally v2 cannot take this campaign")
        await tally(tx, events)  # type: ignore[arg-type]

    app.projector("tally", events=["add"], batch=True)(tally)
    app.projector("tally", events=["add"], batch=True, version=2)(v2)
    return app


async def history(
    pool: db.Pool, settings: Settings, campaigns: list[str], rng: random.Random, journal: Journal
) -> None:
    """1 to 12 events on each campaign, some of another type; each `add`'s n in `journal`."""
    for cid in campaigns:
        events = [
            Event("add", {"n": rng.randint(1, 9)}) if rng.random() < 0.8 else Event("other", {})
            for _ in range(rng.randint(1, 12))
        ]
        await append(pool, cid, events, settings=settings)
        journal.setdefault(cid, []).extend(e.payload["n"] for e in events if e.type == "add")


def totals(journal: Journal, factor: int) -> Counter[str]:
    return Counter({c: sum(ns) * factor for c, ns in journal.items() if ns})


class Killed(Exception):
    """The build's process dies here."""


def dies_at_step(n: int) -> Callable[[Progress], None]:
    """A progress callback that kills the build (raises Killed) after its `n`th step."""
    steps = 0

    def progress(_: Progress) -> None:
        nonlocal steps
        steps += 1
        if steps == n:
            raise Killed

    return progress


@pytest.mark.usefixtures("table", "small_steps")
async def test_a_build_is_exact_and_goes_on_from_its_checkpoints_after_a_kill(
    pool: db.Pool, dsn: str
) -> None:
    rng = random.Random(30)
    journal: Journal = {}
    old = Outbox(Settings(dsn=dsn))
    old.projector("tally", events=["add"], batch=True)(tally)
    await history(pool, old.settings, [f"c{i:02d}" for i in range(40)], rng, journal)
    await drain_now(old, pool)
    app = app_of(dsn)
    v2 = versioned(app.registry, "tally", 2)
    plan = await planned(pool, v2)
    assert plan.events_total == sum(len(ns) for ns in journal.values())

    with pytest.raises(Killed):
        await build(pool, v2, connections=1, progress=dies_at_step(5))
    # Whatever committed is whole: each campaign's sum is its first events' up to its checkpoint.
    at = {
        r["campaign_id"]: r["applied_seq"]
        for r in await pool.fetch(
            "SELECT campaign_id, applied_seq FROM outbox.projection_checkpoints "
            "WHERE projector = 'tally@v2'"
        )
    }
    partial = await sums(pool, "tally@v2")
    seen = await pool.fetch(
        "SELECT campaign_id, seq, event_type, payload FROM outbox.event_journal ORDER BY 1, 2"
    )
    upto: Counter[str] = Counter()
    for r in seen:
        if r["event_type"] == "add" and r["seq"] <= at.get(r["campaign_id"], 0):
            upto[r["campaign_id"]] += r["payload"]["n"] * 2
    assert partial == upto
    assert 0 < sum(partial.values()) < sum(totals(journal, 2).values())

    states: list[Progress] = []
    built = await build(pool, v2, connections=3, progress=states.append)
    assert built.complete
    assert await sums(pool, "tally@v2") == totals(journal, 2)
    assert await sums(pool, "tally") == totals(journal, 1)
    # Resumed: its counters go on from the stopped build's record, the whole journal in all.
    assert built.progress.resumed
    assert built.progress.events == sum(len(ns) for ns in journal.values())
    assert states[0].events >= sum(
        1 for r in seen if r["event_type"] == "add" and r["seq"] <= at.get(r["campaign_id"], 0)
    )
    assert [s.events for s in states] == sorted(s.events for s in states)
    assert states[-1].done
    assert states[-1].eta == 0.0
    # Built and recorded by a worker, it is caught up: promoted at once.
    await drain_now(app, pool)
    assert (await promote_version(pool, "tally", 2)).lag.caught_up


@pytest.mark.usefixtures("table", "small_steps")
async def test_a_build_beside_live_appends_and_a_worker_applies_each_event_once(
    pool: db.Pool, dsn: str
) -> None:
    rng = random.Random(31)
    journal: Journal = {}
    campaigns = [f"c{i:02d}" for i in range(30)]
    app = app_of(dsn)
    await history(pool, app.settings, campaigns, rng, journal)
    await drain_now(app, pool)  # v1 and v2 both, v2 through the workers' catch-up
    more = app_of(dsn)
    await pool.execute("DELETE FROM sums WHERE projector = 'tally@v2'")
    await pool.execute(
        "DELETE FROM outbox.projection_checkpoint_moves WHERE projector = 'tally@v2'"
    )
    await pool.execute("DELETE FROM outbox.projection_checkpoint_keys WHERE projector = 'tally@v2'")
    v2 = versioned(more.registry, "tally", 2)

    async def appends() -> None:
        for _ in range(3):
            await history(pool, more.settings, rng.sample(campaigns, 10), rng, journal)
            await drain_now(more, pool)

    async with anyio.create_task_group() as tg:
        tg.start_soon(appends)
        await build(pool, v2, connections=2)
    await build(pool, v2)  # what batches held during the first is the engine's or theirs
    await drain_now(more, pool)
    assert await sums(pool, "tally@v2") == totals(journal, 2)
    assert await sums(pool, "tally") == totals(journal, 1)


@pytest.mark.usefixtures("table")
async def test_a_campaign_a_batch_holds_is_skipped_and_a_failing_one_left_to_the_workers(
    pool: db.Pool, dsn: str
) -> None:
    rng = random.Random(32)
    journal: Journal = {}
    app = app_of(dsn, failing="bad")
    v1 = Outbox(Settings(dsn=dsn))
    v1.projector("tally", events=["add"], batch=True)(tally)
    await history(pool, v1.settings, ["bad", "held", "ok1", "ok2"], rng, journal)
    await drain_now(v1, pool)
    v2 = versioned(app.registry, "tally", 2)
    await pool.execute(
        "INSERT INTO outbox.projection_checkpoint_keys (bucket, campaign_id, projector, "
        "applied_seq) VALUES (outbox.outbox_bucket('held'), 'held', 'tally@v2', 0)"
    )
    bucket = await pool.fetchval("SELECT outbox.outbox_bucket('held')")
    async with pool.acquire() as holder, holder.transaction():
        await holder.execute(  # as a batch holds the campaign's checkpoints
            "SELECT FROM outbox.projection_checkpoint_keys "
            "WHERE bucket = $1 AND campaign_id = 'held' FOR UPDATE",
            bucket,
        )
        built = await build(pool, v2)
    assert (built.progress.skipped, built.progress.failed) == (1, 1)
    done = await sums(pool, "tally@v2")
    assert done == Counter({c: n for c, n in totals(journal, 2).items() if c in ("ok1", "ok2")})


def test_the_engine_builds_ordered_projectors_only() -> None:
    app = Outbox(Settings())

    async def fn(tx: db.Connection, event: object) -> None: ...

    app.projector("marks", events=["add"], ordered=False, idempotent=True, version=2)(fn)
    with pytest.raises(ConfigError, match="builds ordered projectors"):
        engine.buildable(versioned(app.registry, "marks", 2))
    with pytest.raises(ConfigError, match="registers no version 3 of projector 'marks'"):
        versioned(app.registry, "marks", 3)


@pytest.mark.usefixtures("table")
async def test_the_command_line_builds_a_version_with_progress_lines(
    pool: db.Pool, dsn: str
) -> None:
    rng = random.Random(33)
    journal: Journal = {}
    v1 = Outbox(Settings(dsn=dsn))
    v1.projector("tally", events=["add"], batch=True)(tally)
    await history(pool, v1.settings, [f"c{i}" for i in range(12)], rng, journal)
    await drain_now(v1, pool)
    env = {"PYTHONPATH": os.pathsep.join([str(TESTS), str(EXAMPLES)])}
    args = ["projections-rebuild", "--app", "worker_apps:versioned", "--projector", "tally"]
    dry = run_cli("maintenance", *args, "--as-version", "2", dsn=dsn, env=env)
    assert dry.returncode == 0, dry.stderr
    assert "would build tally@v2" in dry.stderr
    done = run_cli("maintenance", *args, "--as-version", "2", "--yes", "--json", dsn=dsn, env=env)
    assert done.returncode == 0, done.stderr
    lines = [orjson.loads(line) for line in done.stdout.splitlines()]
    assert lines[-1]["mode"] == "projections-rebuild"
    assert lines[-1]["done"] is True
    assert lines[-1]["events"] == lines[-1]["events_total"] == sum(map(len, journal.values()))
    assert all(line["mode"] == "projections-rebuild.progress" for line in lines[:-1])
    assert await sums(pool, "tally@v2") == totals(journal, 2)
    for bad, error in [
        (["--as-version", "3", "--yes"], "registers no version 3 of projector 'tally'"),
        (["--as-version", "1"], "--as-version"),
        (["--as-version", "2", "--connections", "0"], "--connections"),
        (["--as-version", "2", "--campaign-id", "c1"], "builds one --projector"),
    ]:
        refused = run_cli("maintenance", *args, *bad, dsn=dsn, env=env)
        assert refused.returncode != 0
        assert error in refused.stderr
        assert "Traceback" not in refused.stderr


@pytest.mark.usefixtures("table")
async def test_a_step_probes_the_campaign_rows_and_holds_only_the_keys(
    pool: db.Pool, dsn: str
) -> None:
    """A batch holding a campaign's row has the step skip it; the step itself lets go of the
    rows it probed (a batch that does not run the version never waits for it)."""
    app = Outbox(Settings(dsn=dsn))
    app.projector("tally", events=["add"], batch=True)(tally)
    await history(pool, app.settings, ["busy", "free"], random.Random(34), {})  # queued rows
    bucket = await pool.fetchval("SELECT outbox.outbox_bucket('busy')")
    free_bucket = await pool.fetchval("SELECT outbox.outbox_bucket('free')")

    async def step(builder: db.Connection, bucket: int, campaign: str) -> list[tuple[str, bool]]:
        """A step over one campaign, its key made first (in the caller's transaction)."""
        await builder.fetchval("SELECT outbox.outbox_build_keys('tally@v2', $1, NULL, 10)", bucket)
        rows = await builder.fetch(
            "SELECT campaign_id, locked FROM outbox.outbox_build_step('tally@v2', $1, ARRAY[$2])",
            bucket,
            campaign,
        )
        return [(r["campaign_id"], r["locked"]) for r in rows]

    async with pool.acquire() as batch, pool.acquire() as builder:
        async with batch.transaction():  # as a batch's claim holds the campaign's row
            await batch.execute(
                "SELECT FROM outbox.projection_apply_campaigns "
                "WHERE bucket = $1 AND campaign_id = 'busy' FOR UPDATE",
                bucket,
            )
            async with builder.transaction():
                assert await step(builder, bucket, "busy") == [("busy", False)]
        async with builder.transaction():
            assert await step(builder, free_bucket, "free") == [("free", True)]
            # The step is open and holds the key, not the campaign's row.
            async with batch.transaction():
                assert await batch.fetchval(
                    "SELECT count(*) FROM (SELECT FROM outbox.projection_apply_campaigns "
                    "WHERE bucket = $1 AND campaign_id = 'free' FOR UPDATE NOWAIT) r",
                    free_bucket,
                )


@pytest.mark.usefixtures("table")
async def test_the_command_line_catches_a_new_projector_up(pool: db.Pool, dsn: str) -> None:
    """`--catch-up`: a projector deployed onto history (here never run) built from the journal
    by the engine, resetting nothing."""
    rng = random.Random(35)
    journal: Journal = {}
    await history(pool, Settings(dsn=dsn), [f"c{i}" for i in range(9)], rng, journal)
    env = {"PYTHONPATH": os.pathsep.join([str(TESTS), str(EXAMPLES)])}
    args = ["projections-rebuild", "--app", "worker_apps:versioned", "--projector", "tally"]
    done = run_cli("maintenance", *args, "--catch-up", "--yes", "--json", dsn=dsn, env=env)
    assert done.returncode == 0, done.stderr
    end = orjson.loads(done.stdout.splitlines()[-1])
    assert (end["kind"], end["done"], end["events"]) == (
        "catch-up",
        True,
        sum(map(len, journal.values())),
    )
    assert await sums(pool, "tally") == totals(journal, 1)
    refused = run_cli("maintenance", *args, "--catch-up", "--as-version", "2", dsn=dsn, env=env)
    assert refused.returncode == 2
    assert "--as-version or --catch-up builds one --projector" in refused.stderr


@pytest.mark.usefixtures("table", "small_steps")
async def test_the_cap_counts_the_projectors_events_and_the_totals_add_up(
    pool: db.Pool, dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--max-rate` caps the projector's events (what the progress counts), not the journal
    positions a step walks past (a cap of 100 once showed ~15 events/s); a build's recorded
    totals are never below what it did (appends after its count once read 21,754 of 21,576)."""
    taken: list[int] = []

    class Counted(Throttle):
        async def take(self, events: int) -> None:
            taken.append(events)
            await super().take(events)

    monkeypatch.setattr(engine, "Throttle", Counted)
    rng = random.Random(36)
    journal: Journal = {}
    await history(pool, Settings(dsn=dsn), [f"c{i:02d}" for i in range(20)], rng, journal)
    positions = await pool.fetchval("SELECT count(*) FROM outbox.event_journal")
    app = app_of(dsn)
    built = await build(pool, versioned(app.registry, "tally", 2), max_rate=1e9)
    events = sum(map(len, journal.values()))
    assert (built.progress.events, sum(taken)) == (events, events)
    assert positions > events  # the journal holds other types: walked past, never counted
    # A record whose count fell short of what the build did (appends after the count) reads
    # its totals as what was done, never "more done than there was".
    await pool.execute("UPDATE outbox.outbox_builds SET events_total = 1, campaigns_total = 1")
    (listed,) = await list_builds(pool)
    assert (listed.events, listed.events_total) == (events, events)
    assert listed.campaigns == listed.campaigns_total
    # The progress the same way: a step's counts lift totals counted lower.
    progress = Progress("p", 5, 2, counted=True)
    progress.count(Part(events=7, campaigns=3))
    assert (progress.events_total, progress.campaigns_total, progress.left) == (7, 3, 0)


def interrupted_after_first_line(command: list[str], env: dict[str, str]) -> tuple[int, str]:
    """Run `command`, SIGINT it once its first progress line says it started: its exit code
    and stderr."""
    proc = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    assert proc.stdout is not None
    first = orjson.loads(proc.stdout.readline())
    assert first["mode"] == "projections-rebuild.progress"
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    return proc.returncode, err


async def test_an_interrupted_build_says_how_to_resume_and_the_next_run_resumes_it(
    pool: db.Pool, dsn: str
) -> None:
    """Ctrl-C ends a build with one line saying where it stopped and how to go on; the same
    command again says it resumes, with what it carried, and ends exact."""
    await pool.execute(SUMS)
    rng = random.Random(37)
    journal: Journal = {}
    await history(pool, Settings(dsn=dsn), [f"c{i:02d}" for i in range(40)], rng, journal)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), str(EXAMPLES)])}
    env = {k: v for k, v in env.items() if not k.startswith("OUTBOX_")} | {"OUTBOX_DSN": dsn}
    args = ["projections-rebuild", "--app", "worker_apps:versioned", "--projector", "tally"]
    # One event a second: the first step's events hold it in the cap's wait, long enough to
    # interrupt once its first progress line says it started.
    command = [str(BIN / "maintenance"), *args, "--as-version", "2", "--yes", "--json"]
    code, err = await anyio.to_thread.run_sync(
        interrupted_after_first_line, [*command, "--max-rate", "1", "--connections", "1"], env
    )
    assert code == 130
    # One line of its own, last (a log line of the cancelled connection may come before it).
    line = err.strip().splitlines()[-1]
    assert "Traceback" not in err
    assert line.startswith("maintenance: error: interrupted: tally@v2 stopped after ")
    assert line.endswith(": run the same command again to resume")
    again = run_cli("maintenance", *args, "--as-version", "2", "--yes", "--json", dsn=dsn, env=env)
    assert again.returncode == 0, again.stderr
    lines = [orjson.loads(one) for one in again.stdout.splitlines()]
    assert lines[0]["mode"] == "projections-rebuild.resumed"
    assert lines[0]["resumed"] is True
    assert lines[-1]["done"] is True
    assert lines[-1]["events"] == sum(map(len, journal.values()))
    assert await sums(pool, "tally@v2") == totals(journal, 2)


async def test_the_engine_yields_to_a_live_path_that_falls_behind(pool: db.Pool) -> None:
    """Live first (issue 60): while the live path's oldest due campaign waits past its target,
    a step halves the engine's pace and waits; once the live path keeps up, the pace rises
    again, back to none past its ceiling."""
    pace = LivePace(every=0.0, longest=0.01, ceiling=1e9)
    async with pool.acquire() as conn:
        await pace.step_done(conn, 1000)
        assert (pace.rate, pace.paced) == (None, 0)  # nothing waits: unpaced
        await append(pool, "live", [Event("add", {"n": 1})])
        # Its campaign due for a minute: the live workers fell behind.
        minute_ago = await conn.fetchval("SELECT clock_timestamp() - interval '1 minute'")
        await conn.execute("UPDATE outbox.projection_apply_campaigns SET due_at = $1", minute_ago)
        await pace.step_done(conn, 1000)
        assert pace.rate is not None
        assert pace.rate >= pace.floor
        assert pace.paced >= 1
        slowed = pace.rate
        await conn.execute("DELETE FROM outbox.projection_apply_campaigns")
        await pace.step_done(conn, 1000)
        assert pace.rate == slowed * 1.25
        pace.rate = pace.ceiling
        await pace.step_done(conn, 0)
        assert pace.rate is None
