"""Paused projectors (maintenance projector-pause/-resume): a paused projector holds only
itself (S24): its share waits in holds, no attempt is consumed, the campaign's other projectors
go on, drains end instead of waiting for a resume, inline apply leaves its events to the
workers; a resume lets it apply what it owes.

"Time passing" is a due time moved back by the test, never a sleep; the pause cache re-reads
at every batch (interval 0), as a worker does once per poll interval."""

from __future__ import annotations

import anyio
import orjson
import pytest

from helpers import TESTS, WORKER, campaigns_in_one_bucket, run_cli, worker_env
from outbox import Event, Settings, db
from outbox.model import StoredEvent
from outbox.ops.pause import Pauses, list_paused, pause_projector, resume_projector
from outbox.ops.report import outbox_report
from outbox.projection.app import Outbox
from outbox.worker.batch import Worker
from outbox.worker.runtime import drain_now


def shop(dsn: str, *, ordered: bool = True, **settings: object) -> Outbox:
    """`totals` counts order.placed, `mailer` counts order.shipped, per campaign."""
    app = Outbox(Settings(dsn=dsn, **settings))  # type: ignore[arg-type]

    async def count(tx: db.Connection, event: StoredEvent, kind: str) -> None:
        await tx.execute(
            "INSERT INTO counted (campaign_id, kind, n) VALUES ($1, $2, 1) "
            "ON CONFLICT (campaign_id, kind) DO UPDATE SET n = counted.n + 1",
            event.campaign_id,
            kind,
        )

    @app.projector("totals", events=["order.placed"], ordered=ordered)
    async def totals(tx: db.Connection, event: StoredEvent) -> None:
        await count(tx, event, "placed")

    @app.projector("mailer", events=["order.shipped"], ordered=ordered)
    async def mailer(tx: db.Connection, event: StoredEvent) -> None:
        await count(tx, event, "shipped")

    app.pauses.interval = 0
    return app


@pytest.fixture(autouse=True)
async def counted(pool: db.Pool) -> None:
    await pool.execute(
        "CREATE TABLE counted (campaign_id text, kind text, n int, PRIMARY KEY (campaign_id, kind))"
    )


async def tallies(pool: db.Pool) -> dict[tuple[str, str], int]:
    rows = await pool.fetch("SELECT campaign_id, kind, n FROM counted")
    return {(r["campaign_id"], r["kind"]): r["n"] for r in rows}


async def outstanding(pool: db.Pool) -> list[tuple[str, int, str, int]]:
    rows = await pool.fetch(
        "SELECT campaign_id, seq, status, attempt_count FROM outbox.projection_apply_outbox "
        "ORDER BY 1, 2"
    )
    return [tuple(r) for r in rows]


ORDER = [Event("order.placed", {}), Event("order.shipped", {}), Event("order.placed", {})]


async def holds(pool: db.Pool) -> list[tuple[str, str, int, str]]:
    rows = await pool.fetch(
        "SELECT campaign_id, projector, seq, status FROM outbox.projection_holds ORDER BY 1, 2"
    )
    return [tuple(r) for r in rows]


async def come_due(pool: db.Pool) -> None:
    """A poll interval passes: the campaigns and holds left for later are due."""
    await pool.execute(
        "UPDATE outbox.projection_apply_campaigns SET due_at = statement_timestamp()"
    )
    await pool.execute("UPDATE outbox.projection_holds SET next_attempt_at = statement_timestamp()")


async def test_a_paused_projector_holds_only_itself_and_a_resume_catches_it_up(
    pool: db.Pool, dsn: str
) -> None:
    app = shop(dsn)
    c, d = campaigns_in_one_bucket(2, "shop")  # one batch claims both
    await app.append(pool, c, ORDER)
    await app.append(pool, d, [Event("order.placed", {})] * 2)
    paused = await pause_projector(pool, "mailer", reason="smtp down", registry=app.registry)
    assert (paused.created, paused.pause.reason) == (True, "smtp down")
    again = await pause_projector(pool, "mailer", reason="later", actor="bob")
    assert (again.created, again.pause.reason) == (False, "smtp down")  # the first pause stands
    worker = Worker(app, pool)
    counts = await worker.run_once()
    # `totals` applied everything it takes, `c`'s third event too; `mailer`'s event waits in
    # its hold on `c` at that event (its row went: the journal has it), no attempt consumed.
    assert (counts.applied, counts.held, counts.paused, counts.failed) == (4, 1, 1, 0)
    assert await outstanding(pool) == []
    assert await holds(pool) == [(c, "mailer", 2, "pending")]
    assert await tallies(pool) == {(c, "placed"): 2, (d, "placed"): 2}
    assert await pool.fetchval(
        "SELECT due_at > clock_timestamp() FROM outbox.projection_apply_campaigns WHERE "
        "campaign_id = $1",
        c,
    )
    assert (await worker.run_once()).claimed == 0  # not looked at again before its time
    # The report says why the hold waits: the pause, not a failure (issue 61).
    held = (await outbox_report(pool)).summary.holds
    assert [(h.projector, h.waiting, h.paused) for h in held] == [("mailer", 1, True)]
    text = run_cli("maintenance", "outbox-report", dsn=dsn)
    assert text.returncode == 0, text.stderr
    assert "paused: resume it to go on" in text.stdout
    await come_due(pool)  # still paused: left again, still no attempt
    assert (await worker.run_once()).paused == 1
    assert await holds(pool) == [(c, "mailer", 2, "pending")]
    resumed = await resume_projector(pool, "mailer")
    again_resumed = await resume_projector(pool, "mailer", registry=app.registry)
    assert (resumed.resumed, again_resumed.resumed) == (True, False)
    listed = await list_paused(pool)
    assert listed.pauses == []
    # Audited: the pause that took (the second changed nothing) and the resume.
    assert [(e.action, e.reason) for e in listed.history] == [
        ("resume", None),
        ("pause", "smtp down"),
    ]
    await come_due(pool)
    assert (await worker.run_once()).applied == 1  # from the journal
    assert await holds(pool) == []
    assert await tallies(pool) == {(c, "placed"): 2, (c, "shipped"): 1, (d, "placed"): 2}


async def test_under_ordering_none_only_the_paused_rows_wait(pool: db.Pool, dsn: str) -> None:
    app = shop(dsn, ordered=False, ordering="none")
    await app.append(pool, "c", ORDER)
    await pause_projector(pool, "mailer", registry=app.registry)
    counts = await Worker(app, pool).run_once()
    assert (counts.applied, counts.paused) == (2, 1)
    assert await outstanding(pool) == [("c", 2, "pending", 0)]
    assert await holds(pool) == [("c", "mailer", 2, "pending")]
    assert await pool.fetchval(
        "SELECT next_attempt_at > clock_timestamp() FROM outbox.projection_apply_outbox"
    )


async def test_a_drain_ends_instead_of_waiting_for_a_resume(pool: db.Pool, dsn: str) -> None:
    app = shop(dsn)
    await app.append(pool, "c", ORDER)
    await pause_projector(pool, "mailer", registry=shop(dsn).registry)  # before any worker
    totals = await drain_now(app, pool)
    # Looked at once more if the drain's catch-up of `totals` by the engine (S25) outlasted a
    # poll interval: the drain ends either way, without `mailer`.
    assert (totals.applied, totals.held) == (2, 1)
    assert totals.paused in (1, 2)


async def test_outbox_worker_drain_ends_while_a_projector_is_paused(
    pool: db.Pool, dsn: str
) -> None:
    """`--drain` waits out backoffs, never a pause: it ends and says what it left."""
    await shop(dsn).append(pool, "x", [Event("order.placed", {})] * 2)
    await pause_projector(pool, "totals", registry=shop(dsn).registry)  # before any worker
    proc = await anyio.run_process(
        [*WORKER, "--app", "worker_apps:shop", "--drain", "--json"],
        cwd=TESTS,
        env=worker_env(dsn),
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    body = orjson.loads(proc.stdout)
    counts = body["counts"]
    # Left in `totals`'s hold, looked at once more a poll interval later (still paused): the
    # drain then ends.
    assert (counts["applied"], counts["held"], counts["paused"]) == (0, 2, 2)
    assert body["left"]["pending"] == 0  # what `totals` owes is its hold on `x`
    assert await outstanding(pool) == []
    assert await holds(pool) == [("x", "totals", 1, "pending")]


async def test_inline_apply_leaves_a_paused_projectors_events_to_the_workers(
    pool: db.Pool, dsn: str
) -> None:
    app = shop(dsn, inline_apply=True)
    await pause_projector(pool, "mailer", registry=shop(dsn).registry)  # before any worker
    await app.append(pool, "c", [Event("order.shipped", {})])
    await app.append(pool, "d", [Event("order.placed", {})])
    assert await outstanding(pool) == [("c", 1, "pending", 0)]
    assert await tallies(pool) == {("d", "placed"): 1}
    await resume_projector(pool, "mailer")
    await app.append(pool, "e", [Event("order.shipped", {})])
    assert ("e", "shipped") in await tallies(pool)


def test_an_unknown_projector_is_refused_with_the_app(dsn: str) -> None:
    proc = run_cli(
        "maintenance",
        *("projector-pause", "--projector", "nope", "--app", "campaigns_demo.app:app"),
        dsn=dsn,
    )
    assert proc.returncode == 1  # docs/cli.md: a name that is not found
    assert len(proc.stderr.strip().splitlines()) == 1
    assert "'nope' is not a projector of the app" in proc.stderr


@pytest.mark.parametrize(
    "command",
    [
        ["projector-pause", "--projector", "spnd"],
        ["projector-resume", "--projector", "spnd"],
        ["outbox-requeue-dead", "--projector", "spnd", "--limit", "10"],
        ["outbox-requeue", "--campaign-id", "x", "--seq", "1", "--projector", "spnd"],
        ["health", "--projector", "spnd"],
    ],
    ids=lambda c: c[0],
)
async def test_an_unknown_projector_is_refused_against_the_record_without_the_app(
    pool: db.Pool, dsn: str, command: list[str]
) -> None:
    """A typo pauses, resumes, requeues nothing: with no --app the name is checked against
    the projectors the database records (exit 1, one line naming them)."""
    await shop(dsn).append(pool, "x", [Event("order.placed", {})])
    await drain_now(shop(dsn), pool)  # the worker records totals and mailer
    proc = run_cli("maintenance", *command, dsn=dsn)
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "maintenance: error: projector 'spnd' is not recorded (recorded: mailer, totals)"
    ]
    assert await list_paused(pool) == Pauses([], [])


async def test_a_paused_lease_mode_projector_holds_only_itself(pool: db.Pool, dsn: str) -> None:
    app = Outbox(Settings(dsn=dsn))
    app.pauses.interval = 0

    @app.projector("notify", events=["tick"], transactional=False)
    async def notify(p: db.Pool, event: StoredEvent) -> None:
        await p.execute("INSERT INTO counted VALUES ($1, 'notified', 1)", event.campaign_id)

    @app.projector("ticks", events=["tick"])
    async def ticks(tx: db.Connection, event: StoredEvent) -> None:
        await tx.execute("INSERT INTO counted VALUES ($1, 'ticked', 1)", event.campaign_id)

    await app.append(pool, "c", [Event("tick", {})])
    await pause_projector(pool, "notify", registry=app.registry)
    counts = await Worker(app, pool).run_once()
    # `ticks` applied it; it waits for `notify` alone, in a hold, its row kept.
    assert (counts.leased, counts.applied, counts.paused) == (0, 1, 1)
    assert await outstanding(pool) == [("c", 1, "pending", 0)]
    assert await holds(pool) == [("c", "notify", 1, "pending")]
    await resume_projector(pool, "notify")
    await come_due(pool)
    assert (await Worker(app, pool).run_once()).leased == 1
    kinds = await pool.fetch("SELECT kind FROM counted ORDER BY kind")
    assert [k["kind"] for k in kinds] == ["notified", "ticked"]  # each once
    assert await outstanding(pool) == []
    assert await holds(pool) == []
