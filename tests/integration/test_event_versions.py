"""Events that evolve (issue 62): each journaled event carries its payload's schema version,
and upcasters hand every projector each event at the newest version they reach, on every path
the outbox gives events to projectors: live batches, inline apply, a new projector's catch-up,
the engine's builds and rebuilds, a per-campaign rebuild, a replay, lease mode, SQL projectors
(in the one call and the engine). The oracle is the generator's own list of what each event
becomes at the newest version (`NEWEST`), never what a projector saw first."""

from __future__ import annotations

from typing import Any

import pytest

from outbox import Event, EventBatch, Settings, StoredEvent, append, db
from outbox.errors import ConfigError, ValidationError
from outbox.ops.replay import replay
from outbox.ops.requeue import retry_failed
from outbox.projection.app import Outbox
from outbox.projection.build import build
from outbox.projection.rebuild import rebuild, registered
from outbox.projection.upcasting import Upcaster
from outbox.worker.runtime import drain_now

SEEN = """
CREATE TABLE seen (
    projector text, campaign_id text, seq bigint, version int, payload jsonb,
    PRIMARY KEY (projector, campaign_id, seq)
);
CREATE FUNCTION public.seen_sql(events jsonb) RETURNS void LANGUAGE sql AS $$
    INSERT INTO public.seen
    SELECT 'sql', e->>'campaign_id', (e->>'seq')::bigint, (e->>'version')::int, e->'payload'
    FROM jsonb_array_elements(events) e
$$;
CREATE FUNCTION public.reset_seen_sql(campaign_id text) RETURNS void LANGUAGE sql AS $$
    DELETE FROM public.seen
    WHERE projector = 'sql' AND seen.campaign_id = reset_seen_sql.campaign_id
$$;
CREATE FUNCTION public.clicked_1_2(payload jsonb) RETURNS jsonb LANGUAGE sql AS $$
    SELECT jsonb_build_object('source', payload->>'src')
$$;
CREATE FUNCTION public.clicked_2_3(payload jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
    IF payload->>'source' = 'poison' THEN
        RAISE EXCEPTION 'no such source';
    END IF;
    RETURN payload || jsonb_build_object('n', 1);
END
$$;
"""
RECORD = """
INSERT INTO seen VALUES ($1, $2, $3, $4, $5)
ON CONFLICT (projector, campaign_id, seq) DO UPDATE SET version = excluded.version,
    payload = excluded.payload
"""
# The same click in each version it was ever appended at, and what each is at version 3.
HISTORY = [
    Event("clicked", {"src": "web"}),  # v1
    Event("clicked", {"source": "app"}, version=2),
    Event("clicked", {"source": "api", "n": 5}, version=3),
    Event("noted", {"x": 1}),  # a type no upcaster takes
]
NEWEST = {
    1: (3, {"source": "web", "n": 1}),
    2: (3, {"source": "app", "n": 1}),
    3: (3, {"source": "api", "n": 5}),
    4: (1, {"x": 1}),
}


def v1_to_v2(payload: dict[str, Any]) -> dict[str, Any]:
    return {"source": payload["src"]}


def v2_to_v3(payload: dict[str, Any]) -> dict[str, Any]:
    if payload["source"] == "poison":
        raise ValueError("no such source")
    return {**payload, "n": 1}


def evolving(name: str = "clicks", **options: Any) -> Outbox:
    """A projector recording each event it is given, and the upcasters 1 -> 2 -> 3 of
    `clicked`, Python and SQL."""
    app = Outbox(Settings(**options.pop("settings", {})))
    app.upcaster("clicked", from_version=1)(v1_to_v2)
    app.upcaster("clicked", from_version=2)(v2_to_v3)
    app.sql_upcaster("clicked", from_version=1, function="public.clicked_1_2")
    app.sql_upcaster("clicked", from_version=2, function="public.clicked_2_3")

    async def reset(tx: db.Connection, campaign_id: str) -> None:
        await tx.execute(
            "DELETE FROM seen WHERE projector = $1 AND campaign_id = $2", name, campaign_id
        )

    @app.projector(name, events=["clicked", "noted"], batch=True, reset=reset, **options)
    async def clicks(tx: db.Connection, events: EventBatch) -> None:
        for e in events:
            await tx.execute(RECORD, name, e.campaign_id, e.seq, e.version, e.payload)

    return app


async def seen(pool: db.Pool, projector: str = "clicks") -> dict[tuple[str, int], tuple[int, Any]]:
    rows = await pool.fetch(
        "SELECT campaign_id, seq, version, payload FROM seen WHERE projector = $1", projector
    )
    return {(r["campaign_id"], r["seq"]): (r["version"], r["payload"]) for r in rows}


def newest(*campaigns: str) -> dict[tuple[str, int], tuple[int, Any]]:
    return {(c, seq): value for c in campaigns for seq, value in NEWEST.items()}


@pytest.fixture(autouse=True)
async def tables(pool: db.Pool) -> None:
    await pool.execute(SEEN)


async def test_a_version_travels_through_every_append_and_the_journal_keeps_it(
    pool: db.Pool,
) -> None:
    await append(pool, "c1", HISTORY)
    await pool.execute(
        "SELECT * FROM outbox.outbox_append('c2', $1)",
        [{"type": "clicked", "payload": {"source": "sql"}, "version": 2}],
    )
    versions = await pool.fetch(
        "SELECT campaign_id, seq, version FROM outbox.event_journal ORDER BY 1, 2"
    )
    assert [tuple(r) for r in versions] == [
        ("c1", 1, 1),
        ("c1", 2, 2),
        ("c1", 3, 3),
        ("c1", 4, 1),
        ("c2", 1, 2),
    ]
    for bad in (0, -1, True, "2", 1.0):
        with pytest.raises(ValidationError, match="version: expected an integer from 1"):
            await append(pool, "c3", [Event("clicked", {}, version=bad)])  # type: ignore[arg-type]
    # A keyed append of version-1 events fingerprints as before versions existed: its retry
    # matches; the same events at another version are other events.
    first = await append(pool, "c4", [Event("noted", {})], idempotency_key="k")
    again = await append(pool, "c4", [Event("noted", {})], idempotency_key="k")
    assert (again.duplicate, again.first_seq) == (True, first.first_seq)


async def test_projectors_get_each_event_at_its_newest_version_live_and_inline(
    pool: db.Pool, dsn: str
) -> None:
    app = evolving(settings={"dsn": dsn})
    await append(pool, "c1", HISTORY)
    await drain_now(app, pool)
    await app.append(pool, "c2", HISTORY, apply_inline=True)
    assert await seen(pool) == newest("c1", "c2")
    # A projector without upcasters gets the events as they were appended.
    plain = Outbox(Settings(dsn=dsn))

    @plain.projector("raw", events=["clicked"])
    async def raw(tx: db.Connection, event: StoredEvent) -> None:
        await tx.execute(
            RECORD,
            "raw",
            event.campaign_id,
            event.seq,
            event.version,
            event.payload,
        )

    await append(pool, "c3", HISTORY[:3])
    await drain_now(plain, pool)
    raw_seen = await seen(pool, "raw")
    assert [raw_seen[("c3", seq)][0] for seq in (1, 2, 3)] == [1, 2, 3]


async def test_history_catches_up_builds_rebuilds_and_replays_upcast(
    pool: db.Pool, dsn: str
) -> None:
    before = Outbox(Settings(dsn=dsn))
    before.ignore(["clicked", "noted"])
    for c in ("c1", "c2"):
        await append(pool, c, HISTORY)
    await drain_now(before, pool)
    # A new projector catches up from the journal (the workers' sweep, S25).
    app = evolving(settings={"dsn": dsn})
    await drain_now(app, pool)
    assert await seen(pool) == newest("c1", "c2")
    # The engine rebuilds it in place, and a per-campaign rebuild does the same.
    await pool.execute("UPDATE seen SET payload = '{}'")
    clicks = registered(app.registry, "clicks")
    await build(pool, clicks, in_place=True)
    assert await seen(pool) == newest("c1", "c2")
    await pool.execute("UPDATE seen SET payload = '{}' WHERE campaign_id = 'c1'")
    await rebuild(pool, app.registry, projectors=["clicks"], campaign_id="c1", apply=True)
    assert await seen(pool) == newest("c1", "c2")
    # A replay of a queued row.
    await append(pool, "c3", HISTORY)
    for seq in range(1, 5):
        await replay(app, pool, "c3", seq)
    assert await seen(pool) == newest("c1", "c2", "c3")


async def test_a_lease_mode_projector_gets_them_upcast(pool: db.Pool, dsn: str) -> None:
    app = Outbox(Settings(dsn=dsn))
    app.upcaster("clicked", from_version=1)(v1_to_v2)
    app.upcaster("clicked", from_version=2)(v2_to_v3)
    got: list[tuple[int, Any]] = []

    @app.projector("mailer", events=["clicked"], transactional=False)
    async def mailer(pool_: db.Pool, event: StoredEvent) -> None:
        got.append((event.version, event.payload))

    await append(pool, "c1", HISTORY[:3])
    await drain_now(app, pool)
    assert got == [NEWEST[1], NEWEST[2], NEWEST[3]]


@pytest.mark.parametrize("alone", [True, False], ids=["one call", "beside a Python projector"])
async def test_sql_projectors_get_them_upcast_by_sql_upcasters(
    pool: db.Pool, dsn: str, alone: bool
) -> None:
    app = Outbox(Settings(dsn=dsn))
    app.upcaster("clicked", from_version=1)(v1_to_v2)
    app.upcaster("clicked", from_version=2)(v2_to_v3)
    app.sql_upcaster("clicked", from_version=1, function="public.clicked_1_2")
    app.sql_upcaster("clicked", from_version=2, function="public.clicked_2_3")
    app.sql_projector(
        "sql",
        events=["clicked", "noted"],
        function="public.seen_sql",
        reset="public.reset_seen_sql",
    )
    if not alone:

        @app.projector("other", events=["noted"])
        async def other(tx: db.Connection, event: StoredEvent) -> None:
            return None

    await append(pool, "c1", HISTORY)
    await drain_now(app, pool)
    assert await seen(pool, "sql") == newest("c1")
    await pool.execute("UPDATE seen SET payload = '{}'")
    await build(pool, registered(app.registry, "sql"), in_place=True)
    assert await seen(pool, "sql") == newest("c1")


def test_a_sql_projector_of_a_type_with_only_a_python_upcaster_is_refused() -> None:
    app = Outbox(Settings())
    app.upcaster("clicked", from_version=1)(v1_to_v2)
    app.sql_projector("sql", events=["clicked"], function="public.seen_sql")
    with pytest.raises(
        ConfigError,
        match=r"SQL projector 'sql' takes 'clicked', whose upcaster v1 -> v2 is Python only",
    ):
        app.validate()
    with pytest.raises(ConfigError, match="from version 1 registered twice"):
        app.upcaster("clicked", from_version=1)(v1_to_v2)
    with pytest.raises(ConfigError, match="from_version must be a whole number from 1"):
        app.upcaster("clicked", from_version=0)(v1_to_v2)


async def test_an_upcaster_that_raises_fails_the_event_for_its_projector_alone(
    pool: db.Pool, dsn: str
) -> None:
    app = evolving(settings={"dsn": dsn})

    @app.projector("counts", events=["clicked"])
    async def counts(tx: db.Connection, event: StoredEvent) -> None:
        await tx.execute(RECORD, "counts", event.campaign_id, event.seq, 0, {})

    app.sql_projector("sql", events=["clicked"], function="public.seen_sql")

    await append(pool, "c1", [Event("clicked", {"source": "poison"}, version=2), HISTORY[0]])
    await drain_now(app, pool)
    holds = await pool.fetch(
        "SELECT projector, seq, status, last_error FROM outbox.projection_holds ORDER BY 1, 2"
    )
    # Both projectors receive `clicked` upcast: both fail on seq 1 alone, on their own
    # tracks, the upcaster named; seq 2 applied where the projector is not stopped before it.
    assert {(h["projector"], h["seq"]) for h in holds} == {
        ("clicks", 1),
        ("counts", 1),
        ("sql", 1),
    }
    python = [h["last_error"] for h in holds if h["projector"] != "sql"]
    assert all(
        "UpcastFailed: upcaster v2_to_v3 (clicked v2 -> v3) failed on 'c1' seq 1" in e
        for e in python
    )
    (sql,) = [h["last_error"] for h in holds if h["projector"] == "sql"]
    assert "upcaster public.clicked_2_3 (clicked v2 -> v3) failed: no such source" in sql
    # The fix deployed (the upcasters take the poison), the operator retries now: each
    # projector gets the event upcast, and goes on.
    app.registry.upcasters.python["clicked"][2] = Upcaster("clicked", 2, fn=lambda p: {**p, "n": 0})
    await pool.execute(
        "CREATE OR REPLACE FUNCTION public.clicked_2_3(payload jsonb) RETURNS jsonb "
        "LANGUAGE sql AS $$ SELECT payload || jsonb_build_object('n', 0) $$"
    )
    await retry_failed(pool, limit=10)
    await drain_now(app, pool)
    assert await pool.fetch("SELECT * FROM outbox.projection_holds") == []
    for projector in ("clicks", "sql"):
        assert (await seen(pool, projector))[("c1", 1)] == (3, {"source": "poison", "n": 0})
