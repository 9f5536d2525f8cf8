"""A projector's definition is a contract (S33): a worker whose definition of a recorded
projector differs is refused before it writes anything; a change safe in place is recorded by
an operator, audited, and the workers still running the old definition stop running it.

The oracle is what each test appended (`expected`, per campaign): each projector adds every
event's `n` into `sums` under its own name, so an event skipped or applied twice shows there."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from helpers import ADD, SUMS, Clock, run_cli, sums
from outbox import Event, Settings, append, db
from outbox.console import create_app
from outbox.errors import ConfigError, NotFound
from outbox.model import EventBatch, StoredEvent
from outbox.ops.health import health
from outbox.ops.pause import pause_projector, resume_projector
from outbox.ops.reconcile import reconcile
from outbox.ops.redefine import redefine_projector
from outbox.ops.report import outbox_report
from outbox.ops.retire import list_projectors
from outbox.projection.app import Outbox
from outbox.projection.build import build
from outbox.projection.definition import DefinitionDrift
from outbox.worker.batch import Worker
from outbox.worker.registration import Registration
from outbox.worker.runtime import drain_now, running_worker

CAMPAIGNS = [f"d-{i}" for i in range(4)]

ADD_SQL = """
CREATE SCHEMA app;
CREATE FUNCTION app.add(events jsonb) RETURNS void LANGUAGE sql AS $$
    INSERT INTO public.sums AS s (projector, campaign_id, n)
    SELECT 'roster', e->>'campaign_id', sum((e->'payload'->>'n')::bigint)
    FROM jsonb_array_elements(events) e GROUP BY 2
    ON CONFLICT (projector, campaign_id) DO UPDATE SET n = s.n + excluded.n
$$;
CREATE FUNCTION app.add_too(events jsonb) RETURNS void LANGUAGE sql AS $$
    SELECT app.add(events)
$$;
"""


@pytest.fixture(autouse=True)
async def tables(pool: db.Pool) -> None:
    await pool.execute(SUMS)
    await pool.execute(ADD_SQL)


def roster_app(dsn: str, **changed: Any) -> Outbox:
    """`roster`: an ordered per-event projector of `add` adding `n`; `changed` alters its
    registration (`events`, `ordered`, `kind`, `function`, `start`), and `other` adds an
    unchanged projector beside it."""
    app = Outbox(Settings(dsn=dsn, poll_interval=0.05))
    events = changed.get("events", ["add"])
    kind = changed.get("kind", "event")

    async def add(tx: db.Connection, event: StoredEvent) -> None:
        await tx.execute(ADD, "roster", event.campaign_id, event.payload["n"])

    async def add_batch(tx: db.Connection, batch: EventBatch) -> None:
        for event in batch:
            await add(tx, event)

    async def add_other(tx: db.Connection, event: StoredEvent) -> None:
        await tx.execute(ADD, "other", event.campaign_id, event.payload["n"])

    if kind == "sql" or "function" in changed:
        app.sql_projector("roster", events=events, function=changed.get("function", "app.add"))
    elif kind == "lease":
        app.projector("roster", events=events, transactional=False)(add)
    else:
        app.projector(
            "roster",
            events=events,
            ordered=changed.get("ordered"),
            idempotent=changed.get("idempotent", False),
            batch=kind == "batch",
            start=changed.get("start"),
        )(add_batch if kind == "batch" else add)
    app.projector("other", events=["add"])(add_other)
    return app


async def add_events(pool: db.Pool, dsn: str, expected: Counter[str], n: int) -> None:
    for cid in CAMPAIGNS:
        await append(pool, cid, [Event("add", {"n": n})], settings=Settings(dsn=dsn))
        expected[cid] += n


async def written(pool: db.Pool) -> tuple[Any, ...]:
    """Everything a refused worker must leave as it was: the record, the work rows, the holds,
    the checkpoints' moves, the campaign rows and the sums."""
    return tuple(
        [
            await pool.fetch(
                "SELECT projector, definition, fingerprint, last_seen_at, last_seen_by "
                "FROM outbox.outbox_projectors ORDER BY projector"
            ),
            await pool.fetch("SELECT * FROM outbox.projection_apply_outbox ORDER BY 1, 2"),
            await pool.fetchval("SELECT count(*) FROM outbox.projection_holds"),
            await pool.fetchval("SELECT count(*) FROM outbox.projection_checkpoint_moves"),
            await pool.fetch(
                "SELECT campaign_id, due_at FROM outbox.projection_apply_campaigns ORDER BY 1"
            ),
            await pool.fetch("SELECT * FROM sums ORDER BY 1, 2"),
            await pool.fetchval("SELECT count(*) FROM outbox.outbox_workers"),
        ]
    )


@pytest.mark.parametrize(
    ("changed", "shown"),
    [
        ({"events": ["add", "ad.clickd"]}, "events [add] -> [ad.clickd, add]"),
        ({"ordered": False}, "ordered true -> false; start beginning -> now"),
        (
            {"ordered": False, "idempotent": True, "start": "beginning"},
            "ordered true -> false; idempotent false -> true",
        ),
        (
            {"kind": "lease"},
            "ordered true -> false; kind event -> lease; transactional true -> false; "
            "start beginning -> now",
        ),
    ],
    ids=["types", "order-guard", "markers", "lease"],
)
async def test_a_changed_definition_is_refused_and_the_worker_writes_nothing(
    pool: db.Pool, dsn: str, changed: dict[str, Any], shown: str
) -> None:
    expected: Counter[str] = Counter()
    await add_events(pool, dsn, expected, 1)
    await drain_now(roster_app(dsn), pool)
    await add_events(pool, dsn, expected, 2)  # left queued for the drifted worker
    before = await written(pool)
    with pytest.raises(DefinitionDrift) as refused:
        await drain_now(roster_app(dsn, **changed), pool)
    message = str(refused.value)
    assert "\n" not in message
    assert message.startswith(f"projector 'roster' differs from its record ({shown}): ")
    assert "ship it as version 2 (built beside, then promoted)" in message
    assert "projector-redefine" not in message  # no such change is safe in place
    assert "'other'" not in message  # the unchanged projector is not named
    assert await written(pool) == before
    # The workers that run the recorded definition apply every event once.
    await drain_now(roster_app(dsn), pool)
    assert await sums(pool, "roster") == expected
    assert await sums(pool, "other") == expected


async def test_a_sql_projectors_function_is_part_of_its_definition(pool: db.Pool, dsn: str) -> None:
    expected: Counter[str] = Counter()
    await add_events(pool, dsn, expected, 1)
    await drain_now(roster_app(dsn, kind="sql"), pool)
    await add_events(pool, dsn, expected, 2)
    before = await written(pool)
    with pytest.raises(DefinitionDrift, match=r"function app\.add\(jsonb\) -> app\.add_too"):
        await drain_now(roster_app(dsn, function="app.add_too"), pool)
    assert await written(pool) == before
    # From Python to SQL is a change of kind: refused at start too.
    with pytest.raises(DefinitionDrift, match=r"kind sql -> event; function app\.add\(jsonb\) "):
        await drain_now(roster_app(dsn), pool)
    await drain_now(roster_app(dsn, kind="sql"), pool)
    assert await sums(pool, "roster") == expected


async def test_a_safe_change_is_refused_at_start_and_recorded_by_an_operator(
    pool: db.Pool, dsn: str
) -> None:
    expected: Counter[str] = Counter()
    await add_events(pool, dsn, expected, 1)
    old = roster_app(dsn)
    await drain_now(old, pool)
    new = roster_app(dsn, kind="batch", start="now")
    with pytest.raises(DefinitionDrift) as refused:
        await drain_now(new, pool)
    assert "(kind event -> batch; start beginning -> now): record it with `maintenance " in str(
        refused.value
    )
    # An unsafe change is refused by the operator's command as well, and changes nothing.
    with pytest.raises(ConfigError, match=r"events .* ship it as a new version"):
        await redefine_projector(
            pool, "roster", registry=roster_app(dsn, events=["add", "x"]).registry, reason="r"
        )
    with pytest.raises(NotFound, match="'nope' is not in the app"):
        await redefine_projector(pool, "nope", registry=new.registry, reason="r")
    before = {p.projector: p.fingerprint for p in await list_projectors(pool)}
    made = await redefine_projector(pool, "roster", registry=new.registry, reason="batched")
    assert made.changes == ["kind event -> batch", "start beginning -> now"]
    after = {p.projector: p for p in await list_projectors(pool)}
    assert after["roster"].fingerprint == made.fingerprint != before["roster"]
    assert after["roster"].definition is not None
    assert after["roster"].definition["kind"] == "batch"
    assert after["other"].fingerprint == before["other"]
    entry = await pool.fetchrow(
        "SELECT projector, action, reason FROM outbox.outbox_projector_audit "
        "ORDER BY audit_id DESC LIMIT 1"
    )
    assert entry is not None
    assert tuple(entry) == (
        "roster",
        "redefine",
        "batched (kind event -> batch; start beginning -> now)",
    )
    # A worker running the old definition applies `roster` no more: its share waits in holds.
    await add_events(pool, dsn, expected, 2)
    old.absent.expire()  # a poll interval passes: it reads the record again
    stale = Worker(old, pool)
    while (await stale.run_once()).claimed:
        pass
    assert await sums(pool, "other") == expected
    assert await sums(pool, "roster") != expected
    assert await pool.fetchval("SELECT count(*) FROM outbox.projection_holds") == len(CAMPAIGNS)
    # A worker of the new definition starts (its record is current) and, once the holds the
    # stale worker left are due, applies what `roster` owes, once.
    await drain_now(new, pool)
    clock = Clock()
    clock.advance(3600)
    await Worker(new, pool, now=clock).drain()
    assert await sums(pool, "roster") == expected


async def test_a_record_from_before_definitions_is_completed_when_it_agrees(
    pool: db.Pool, dsn: str
) -> None:
    await drain_now(roster_app(dsn), pool)
    # As a worker of the previous release left it: no definition.
    await pool.execute("UPDATE outbox.outbox_projectors SET definition = NULL, fingerprint = NULL")
    with pytest.raises(DefinitionDrift, match=r"ordered true -> false"):
        await drain_now(roster_app(dsn, ordered=False), pool)
    assert (
        await pool.fetchval(
            "SELECT count(*) FROM outbox.outbox_projectors WHERE definition IS NOT NULL"
        )
        == 0
    )
    await drain_now(roster_app(dsn, kind="batch"), pool)  # the fields it kept agree
    recorded = {p.projector: p for p in await list_projectors(pool)}
    assert recorded["roster"].definition is not None
    assert recorded["roster"].definition["kind"] == "batch"


async def test_the_worker_command_refuses_a_drift_in_one_line(
    pool: db.Pool, dsn: str, tmp_path: Path
) -> None:
    file = tmp_path / "projectors.toml"
    file.write_text('[[projector]]\nname = "roster"\nevents = ["add"]\nfunction = "app.add"\n')
    assert run_cli("outbox-worker", "--projectors", str(file), "--drain", dsn=dsn).returncode == 0
    file.write_text('[[projector]]\nname = "roster"\nevents = ["ad"]\nfunction = "app.add"\n')
    refused = run_cli("outbox-worker", "--projectors", str(file), "--drain", dsn=dsn)
    assert refused.returncode == 2
    lines = [x for x in refused.stderr.splitlines() if not x.startswith("{")]  # not the logs
    assert len(lines) == 1
    assert lines[0].startswith(
        "outbox-worker: error: projector 'roster' differs from its record (events [add] -> [ad])"
    )
    shown = run_cli("maintenance", "projectors", "--json", dsn=dsn)
    assert shown.returncode == 0, shown.stderr
    listed = orjson.loads(shown.stdout)["projectors"]
    assert [(p["projector"], p["definition"]["events"]) for p in listed] == [("roster", ["add"])]
    assert listed[0]["fingerprint"] == (await list_projectors(pool))[0].fingerprint


async def test_health_and_the_report_name_a_projector_no_live_worker_runs(
    pool: db.Pool, dsn: str
) -> None:
    expected: Counter[str] = Counter()
    app = roster_app(dsn)
    await drain_now(app, pool)
    fingerprints = {p.projector: p.fingerprint for p in await list_projectors(pool)}
    assert (await health(pool)).healthy  # an idle store: nothing is owed, no alarm
    await add_events(pool, dsn, expected, 1)  # owed to both, and no live worker runs either
    judged = await health(pool)
    assert judged.unserved_projectors == ["other", "roster"]
    assert (
        f"projector 'roster': no live worker runs it (recorded definition "
        f"{fingerprints['roster']}); start a worker with it, or retire it" in judged.reasons
    )
    # A live worker runs `roster` as recorded, and another runs `other` under another
    # definition.
    await Registration(pool, "w-1", "apply", 1, {"roster": str(fingerprints["roster"])}).register()
    drifted = Registration(pool, "w-2", "apply", 1, {"other": "0123456789ab"})
    await drifted.register()
    judged = await health(pool)
    assert judged.unserved_projectors == ["other"]
    assert judged.reasons == [
        "projector 'other': no live worker runs it (recorded definition "
        f"{fingerprints['other']}); start a worker with it, or retire it",
        "projector 'other': live worker(s) run another definition than the recorded "
        f"{fingerprints['other']}: w-2 0123456789ab",
    ]
    summary = (await outbox_report(pool)).summary
    assert [(p.projector, p.fingerprint, p.workers) for p in summary.projectors] == [
        ("other", fingerprints["other"], 0),
        ("roster", fingerprints["roster"], 1),
    ]
    # A paused projector is the operator's doing; a live worker of an earlier release (its
    # projectors not registered) may run any of them: neither raises an alarm.
    await pause_projector(pool, "other", reason="fixing")
    assert (await health(pool)).healthy
    await resume_projector(pool, "other")
    await drifted.stop({})
    await Registration(pool, "w-old", "apply", 1).register()
    assert (await health(pool)).healthy


async def test_the_engine_refuses_to_build_a_changed_definition(pool: db.Pool, dsn: str) -> None:
    expected: Counter[str] = Counter()
    await add_events(pool, dsn, expected, 1)
    await drain_now(roster_app(dsn), pool)
    changed = roster_app(dsn, events=["add", "x"]).registry.projectors["roster"]
    # The drain's catch-up by the engine is recorded; the refused build records nothing.
    recorded = "SELECT count(*) FROM outbox.outbox_builds WHERE state <> 'complete'"
    with pytest.raises(DefinitionDrift, match=r"events \[add\] -> \[add, x\]"):
        await build(pool, changed)
    assert await pool.fetchval(recorded) == 0


async def test_an_embedded_worker_with_a_changed_definition_raises_the_drift(
    pool: db.Pool, dsn: str
) -> None:
    await drain_now(roster_app(dsn), pool)
    with pytest.raises(DefinitionDrift, match="ordered true -> false"):
        async with running_worker(roster_app(dsn, ordered=False), pool):
            pytest.fail("a drifted worker never runs")


async def test_a_stalled_campaign_is_named_until_it_is_repaired(pool: db.Pool, dsn: str) -> None:
    """A campaign whose due head no claim can take (its campaign row lost: a tool wrote around
    the append) is named by health, the report and the console; reconcile repairs it."""
    expected: Counter[str] = Counter()
    app = roster_app(dsn)
    await drain_now(app, pool)
    for p in await list_projectors(pool):  # live workers run both: nothing else to say
        await Registration(
            pool, f"w-{p.projector}", "apply", 1, {p.projector: str(p.fingerprint)}
        ).register()
    await add_events(pool, dsn, expected, 1)
    await pool.execute("DELETE FROM outbox.projection_apply_campaigns WHERE campaign_id = 'd-0'")
    await pool.execute(
        "UPDATE outbox.projection_apply_outbox "
        "SET next_attempt_at = now() - interval '2 minutes' WHERE campaign_id = 'd-0'"
    )
    await Worker(app, pool).drain()  # the others apply; d-0 waits, unseen by the claim
    judged = await health(pool)
    assert judged.stalled_campaigns == 1
    [reason] = judged.reasons
    assert reason.startswith("1 stalled campaign(s) (oldest: campaign 'd-0' is stalled: seq 1 ")
    assert reason.endswith(
        "no claim can take it: it has no campaign row (maintenance reconcile gives it one))"
    )
    assert (await health(pool, max_stall=600)).healthy  # not due long enough for that bound
    summary = (await outbox_report(pool)).summary
    assert [(s.campaign_id, s.seq, s.campaign_due_at) for s in summary.stalled_campaigns] == [
        ("d-0", 1, None)
    ]
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=create_app(pool)), base_url="http://console"
    ) as console:
        assert 'data-stalled="d-0"' in (await console.get("/blocked")).text
    await reconcile(pool, app.registry)
    await Worker(app, pool).drain()
    assert await sums(pool, "roster") == expected
    assert (await health(pool)).healthy
