"""SQL projectors: a PostgreSQL function of the application's, `fn(events jsonb)`, with the
guarantees of a Python projector (exactly once through its checkpoint or markers, order per
campaign, its own failure state, pause, catch-up, rebuild), declared from Python
(`app.sql_projector`) and from a projectors file (`--projectors projectors.toml`).

The oracle is what each test appended (`expected`, per campaign), never what a worker saw: the
functions add each event's `n` into `sums` under their projector's name, as the Python
projectors of test_tracks.py do, and log every event they are given (`sql_given`), so an event
given twice or out of order shows there."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import orjson
import pytest

from helpers import ADD, SUMS, Clock, run_cli, sums
from outbox import Event, Settings, append, db
from outbox.errors import ConfigError
from outbox.model import StoredEvent
from outbox.projection.app import Outbox
from outbox.projection.pauses import pause, resume
from outbox.projection.projectors_file import load_projectors
from outbox.worker.batch import Worker
from outbox.worker.runtime import drain_now, open_pool
from outbox.worker.sql_batch import OneCall
from outbox.worker.sql_batch import Q as ONE_CALL

HOUR = 3600.0

# `app.add_<name>(events)`: each event's n into sums under projector <name>, every event given
# logged; it raises on an event listed in app.poison (seq 0: every event of the campaign).
FUNCTIONS = """
CREATE SCHEMA app;
CREATE TABLE app.poison (campaign_id text, seq bigint);
CREATE TABLE app.given (
    id bigserial PRIMARY KEY, projector text, campaign_id text, seq bigint, event jsonb
);
CREATE FUNCTION app.add_sql(events jsonb) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    bad jsonb;
BEGIN
    SELECT e INTO bad FROM jsonb_array_elements(events) e
    JOIN app.poison p ON p.campaign_id = e->>'campaign_id' AND p.seq IN (0, (e->>'seq')::bigint)
    LIMIT 1;
    IF bad IS NOT NULL THEN
        RAISE EXCEPTION 'add_sql cannot take % seq %', bad->>'campaign_id', bad->>'seq';
    END IF;
    INSERT INTO app.given (projector, campaign_id, seq, event)
    SELECT 'sql', e->>'campaign_id', (e->>'seq')::bigint, e
    FROM jsonb_array_elements(events) WITH ORDINALITY AS x(e, ord) ORDER BY ord;
    INSERT INTO public.sums AS s (projector, campaign_id, n)
    SELECT 'sql', e->>'campaign_id', sum((e->'payload'->>'n')::bigint)
    FROM jsonb_array_elements(events) e GROUP BY 2
    ON CONFLICT (projector, campaign_id) DO UPDATE SET n = s.n + excluded.n;
END
$$;
CREATE FUNCTION app.add_sql_v2(events jsonb) RETURNS void LANGUAGE sql AS $$
    INSERT INTO public.sums AS s (projector, campaign_id, n)
    SELECT 'sql@v2', e->>'campaign_id', sum((e->'payload'->>'n')::bigint)
    FROM jsonb_array_elements(events) e GROUP BY 2
    ON CONFLICT (projector, campaign_id) DO UPDATE SET n = s.n + excluded.n
$$;
CREATE FUNCTION app.add_roster(events jsonb) RETURNS void LANGUAGE sql AS $$
    INSERT INTO public.sums AS s (projector, campaign_id, n)
    SELECT 'roster', e->>'campaign_id', sum((e->'payload'->>'n')::bigint)
    FROM jsonb_array_elements(events) e GROUP BY 2
    ON CONFLICT (projector, campaign_id) DO UPDATE SET n = s.n + excluded.n
$$;
CREATE FUNCTION app.reset_sql(campaign_id text) RETURNS void LANGUAGE sql AS $$
    DELETE FROM public.sums WHERE projector = 'sql' AND sums.campaign_id = reset_sql.campaign_id
$$;
"""


@pytest.fixture(autouse=True)
async def functions(pool: db.Pool) -> None:
    await pool.execute(SUMS)
    await pool.execute(FUNCTIONS)


@pytest.fixture(params=["python", "sql"])
def roster_kind(request: pytest.FixtureRequest) -> str:
    """`roster` in Python (the worker's own batches), or in SQL: then every projector is SQL
    and the worker runs its batches in one call of the server (`sql_batch`)."""
    kind: str = request.param
    return kind


def with_roster(app: Outbox, kind: str) -> Outbox:
    """`roster`, adding each event's n under its name, in Python or SQL; `note` ignored."""
    if kind == "sql":
        app.sql_projector("roster", events=["add"], function="app.add_roster")
    else:

        @app.projector("roster", events=["add"])
        async def roster(tx: db.Connection, event: StoredEvent) -> None:
            await tx.execute(ADD, "roster", event.campaign_id, event.payload["n"])

    app.ignore(["note"])
    return app


def sql_app(settings: Settings, roster: str, *, markers: bool = False) -> Outbox:
    """`sql` (the SQL projector: ordered, or with `markers`) beside `roster`."""
    app = Outbox(settings)
    app.sql_projector(
        "sql",
        events=["add"],
        function="app.add_sql",
        reset="app.reset_sql",
        ordered=not markers,
        idempotent=markers,
    )
    return with_roster(app, roster)


async def add_events(
    pool: db.Pool, settings: Settings, expected: Counter[str], campaign: str, values: list[int]
) -> None:
    events = [Event("add", {"n": v}) for v in values] + [Event("note", {})]
    await append(pool, campaign, events, settings=settings, idempotency_key=f"{campaign}{values}")
    expected[campaign] += sum(values)


async def given(pool: db.Pool) -> list[tuple[str, int]]:
    rows = await pool.fetch("SELECT campaign_id, seq FROM app.given ORDER BY id")
    return [(r["campaign_id"], r["seq"]) for r in rows]


def in_order_once(seen: list[tuple[str, int]]) -> bool:
    last: dict[str, int] = {}
    for campaign, seq in seen:
        if seq <= last.get(campaign, 0):
            return False
        last[campaign] = seq
    return True


CAMPAIGNS = [f"s-{i:02d}" for i in range(6)]


@pytest.mark.parametrize("guard", ["ordered", "markers"])
async def test_a_sql_projector_gets_each_event_once_in_order_as_json(
    pool: db.Pool, dsn: str, guard: str, roster_kind: str
) -> None:
    settings = Settings(dsn=dsn, batch_size=7)
    app = sql_app(settings, roster_kind, markers=guard == "markers")
    expected: Counter[str] = Counter()
    for round_ in range(3):
        for i, cid in enumerate(CAMPAIGNS):
            await add_events(pool, settings, expected, cid, [i + 1, 10 * round_])
        await Worker(app, pool).drain()
    assert await sums(pool, "sql") == expected
    assert await sums(pool, "roster") == expected
    seen = await given(pool)
    assert in_order_once(seen)
    assert len(seen) == 2 * 3 * len(CAMPAIGNS)  # the `add` events alone: `note` is not its type
    event = await pool.fetchval(
        "SELECT event FROM app.given WHERE campaign_id = 's-00' ORDER BY seq LIMIT 1"
    )
    shape = orjson.loads(event) if isinstance(event, str) else event
    assert set(shape) == {
        "campaign_id",
        "seq",
        "type",
        "payload",
        "metadata",
        "recorded_at",
        "version",
    }
    assert (shape["type"], shape["payload"]) == ("add", {"n": 1})
    assert shape["metadata"]["idempotency_key"].startswith("s-00")


async def test_an_event_already_marked_is_not_given_again(
    pool: db.Pool, dsn: str, roster_kind: str
) -> None:
    """Markers (S18): an event whose marker exists (applied before) is a duplicate, skipped."""
    settings = Settings(dsn=dsn)
    expected: Counter[str] = Counter()
    for cid in CAMPAIGNS[:2]:
        await add_events(pool, settings, expected, cid, [1, 20])
    await pool.execute(
        "INSERT INTO outbox.processed_markers (bucket, campaign_id, seq, handler) "
        "VALUES (outbox.outbox_bucket('s-00'), 's-00', 2, 'sql')"
    )
    counts = await Worker(sql_app(settings, roster_kind, markers=True), pool).drain()
    assert counts.failed == 0
    assert await sums(pool, "sql") == expected - Counter({"s-00": 20})
    assert await sums(pool, "roster") == expected
    assert ("s-00", 2) not in await given(pool)


async def test_a_raising_function_fails_its_event_alone_and_holds_only_its_projector(
    pool: db.Pool, dsn: str, roster_kind: str
) -> None:
    settings = Settings(dsn=dsn, backoff_base=120.0, backoff_cap=600.0, batch_size=50)
    app = sql_app(settings, roster_kind)
    expected: Counter[str] = Counter()
    for cid in CAMPAIGNS:
        await add_events(pool, settings, expected, cid, [1, 2, 3])
    await pool.execute("INSERT INTO app.poison VALUES ('s-02', 2)")
    clock = Clock()
    counts = await Worker(app, pool, now=clock).drain()
    assert (counts.failed, counts.dead) == (1, 0)  # the batch halved down to the one event
    assert await sums(pool, "roster") == expected
    assert await sums(pool, "sql") == expected - Counter({"s-02": 5})  # seq 1 only: ordered
    hold = await pool.fetchrow(
        "SELECT campaign_id, projector, seq, status, last_error FROM outbox.projection_holds"
    )
    assert hold is not None
    assert (hold["campaign_id"], hold["projector"], hold["seq"], hold["status"]) == (
        "s-02",
        "sql",
        2,
        "failed",
    )
    assert "add_sql cannot take s-02 seq 2" in hold["last_error"]
    # Fixed: it goes on from its checkpoint, every event once.
    await pool.execute("DELETE FROM app.poison")
    clock.advance(HOUR)
    await Worker(app, pool, now=clock).drain()
    assert await sums(pool, "sql") == expected
    assert in_order_once(await given(pool))


async def test_a_function_raising_on_every_attempt_goes_dead_for_its_projector(
    pool: db.Pool, dsn: str, roster_kind: str
) -> None:
    settings = Settings(dsn=dsn, backoff_base=120.0, backoff_cap=600.0)
    app = sql_app(settings, roster_kind)
    expected: Counter[str] = Counter()
    await add_events(pool, settings, expected, "s-00", [1, 2])
    await pool.execute("INSERT INTO app.poison VALUES ('s-00', 0)")
    clock = Clock()
    for _ in range(settings.max_attempts):
        await Worker(app, pool, now=clock).drain()
        clock.advance(HOUR)
    status = await pool.fetchval(
        "SELECT status FROM outbox.projection_holds WHERE projector = 'sql' AND seq = 1"
    )
    assert status == "dead"
    assert await sums(pool, "roster") == expected
    assert await sums(pool, "sql") == Counter()


async def test_a_paused_sql_projector_waits_and_catches_up_when_resumed(
    pool: db.Pool, dsn: str, roster_kind: str
) -> None:
    settings = Settings(dsn=dsn)
    await pause(pool, "sql", actor="test", reason="deploying its fix")
    expected: Counter[str] = Counter()
    for cid in CAMPAIGNS[:3]:
        await add_events(pool, settings, expected, cid, [4, 5])
    clock = Clock()
    await Worker(sql_app(settings, roster_kind), pool, now=clock).drain()
    assert await sums(pool, "roster") == expected
    assert await sums(pool, "sql") == Counter()
    await resume(pool, "sql", actor="test")
    clock.advance(HOUR)
    await Worker(sql_app(settings, roster_kind), pool, now=clock).drain()  # pauses read afresh
    assert await sums(pool, "sql") == expected
    assert in_order_once(await given(pool))


async def test_a_sql_projector_deployed_onto_history_catches_up_from_the_journal(
    pool: db.Pool, dsn: str, roster_kind: str
) -> None:
    settings = Settings(dsn=dsn)
    before = with_roster(Outbox(settings), roster_kind)
    expected: Counter[str] = Counter()
    for cid in CAMPAIGNS:
        await add_events(pool, settings, expected, cid, [7, 8, 9])
    await drain_now(before, pool)
    assert await sums(pool, "sql") == Counter()
    await drain_now(sql_app(settings, roster_kind), pool)  # start="beginning": swept
    assert await sums(pool, "sql") == expected
    assert in_order_once(await given(pool))


async def test_an_all_sql_worker_runs_each_batch_in_one_statement(
    pool: db.Pool, dsn: str, roster_kind: str
) -> None:
    """Every projector SQL: a plain batch is one statement (claim, functions, settle: S32),
    and a batch it cannot take (a raising function) is the worker's own, run again. The
    counts are the worker's own path's (`roster` in Python: no batch in one call)."""
    settings = Settings(dsn=dsn, batch_size=10, backoff_base=120.0, backoff_cap=600.0)
    expected: Counter[str] = Counter()
    for cid in CAMPAIGNS:
        await add_events(pool, settings, expected, cid, [1, 2])
    one = await open_pool(settings, max_size=1)
    try:
        seen: list[str] = []
        async with one.acquire() as conn:
            conn.add_query_logger(lambda record: seen.append(record.query))
        worker = Worker(sql_app(settings, roster_kind), one)
        counts = await worker.drain()
        claims = [q for q in seen if "outbox_claim(" in q and "outbox_apply_sql_batch" not in q]
        calls = [q for q in seen if "outbox_apply_sql_batch" in q]
        assert (counts.claimed, counts.applied, counts.skipped) == (18, 12, 6)  # `note` ignored
        assert await sums(pool, "sql") == expected
        assert await sums(pool, "roster") == expected
        if roster_kind == "python":
            assert claims
            assert not calls
            return
        assert calls
        assert not claims
        assert not [q for q in seen if q.strip().upper() in ("BEGIN", "COMMIT")]
        # A function raising: the call undoes the batch, and the worker's own path isolates it.
        await pool.execute("INSERT INTO app.poison VALUES ('s-01', 0)")
        await add_events(pool, settings, expected, "s-01", [5])
        await add_events(pool, settings, expected, "s-02", [6])
        seen.clear()
        counts = await worker.drain()
        assert (counts.failed, counts.dead) == (1, 0)
        assert await sums(pool, "roster") == expected
        assert await sums(pool, "sql") == expected - Counter({"s-01": 5})
        assert [q for q in seen if "outbox_claim(" in q and "outbox_apply_sql_batch" not in q]
    finally:
        await one.close()


async def test_the_one_call_declines_a_batch_that_is_not_plain_and_writes_nothing(
    pool: db.Pool, dsn: str
) -> None:
    """The one call takes a plain batch alone: rows with a gap between them (a row deleted by
    hand), or a first row an ordered checkpoint is not right before, are declined with the
    reason and nothing written; the worker's own path then applies them from the journal."""
    settings = Settings(dsn=dsn)
    expected: Counter[str] = Counter()
    await add_events(pool, settings, expected, "gap", [1, 2])  # seqs 1, 2 and a note, 3
    await add_events(pool, settings, expected, "behind", [4])  # seqs 1 and a note, 2
    await pool.execute(
        "DELETE FROM outbox.projection_apply_outbox "
        "WHERE (campaign_id, seq) IN (('gap', 2), ('behind', 1))"
    )
    plan = OneCall.of(sql_app(settings, "sql").registry)
    assert plan is not None
    reasons = {}
    for campaign in ("gap", "behind"):
        row = await pool.fetchrow(
            ONE_CALL.apply_sql_batch,
            await pool.fetchval("SELECT outbox.outbox_bucket($1)", campaign),
            10,
            100,
            plan.plan(None, "all"),
        )
        assert row is not None
        assert (row["handled"], row["claimed"], row["applied"]) == (False, 0, 0)
        reasons[campaign] = row["reason"]
    assert reasons["gap"] == "campaign gap has a gap before seq 3"
    assert reasons["behind"] == "projector roster is at seq 0 of campaign behind, not 1"
    left = await pool.fetch(
        "SELECT campaign_id, seq FROM outbox.projection_apply_outbox ORDER BY 1, 2"
    )
    assert [(r["campaign_id"], r["seq"]) for r in left] == [("behind", 2), ("gap", 1), ("gap", 3)]
    assert await sums(pool, "sql") == Counter()
    await Worker(sql_app(settings, "sql"), pool).drain()
    assert await sums(pool, "sql") == expected
    assert await sums(pool, "roster") == expected
    assert in_order_once(await given(pool))


PROJECTORS_FILE = """
ignore = ["note"]

[[projector]]
name = "sql"
events = ["add"]
function = "app.add_sql"
reset = "app.reset_sql"
"""


async def test_the_stock_worker_runs_a_projectors_file_and_rebuilds_from_it(
    pool: db.Pool, dsn: str, tmp_path: Path
) -> None:
    settings = Settings(dsn=dsn)
    expected: Counter[str] = Counter()
    for cid in CAMPAIGNS:
        await add_events(pool, settings, expected, cid, [3, 4])
    file = tmp_path / "projectors.toml"
    file.write_text(PROJECTORS_FILE)
    drained = run_cli("outbox-worker", "--projectors", str(file), "--drain", dsn=dsn)
    assert drained.returncode == 0, drained.stderr
    assert await sums(pool, "sql") == expected
    # Rebuilt in place from the file (its reset hook, then the journal): the same sums.
    await pool.execute("UPDATE sums SET n = -1 WHERE projector = 'sql'")
    rebuilt = run_cli(
        "maintenance", "projections-rebuild", "--app", str(file), "--projector", "sql", "--yes",
        dsn=dsn,
    )  # fmt: skip
    assert rebuilt.returncode == 0, rebuilt.stderr
    assert await sums(pool, "sql") == expected


async def test_a_version_from_the_file_is_built_beside_the_live_one_and_promoted(
    pool: db.Pool, dsn: str, tmp_path: Path
) -> None:
    settings = Settings(dsn=dsn)
    expected: Counter[str] = Counter()
    for cid in CAMPAIGNS:
        await add_events(pool, settings, expected, cid, [5, 6])
    file = tmp_path / "projectors.toml"
    file.write_text(PROJECTORS_FILE)
    assert run_cli("outbox-worker", "--projectors", str(file), "--drain", dsn=dsn).returncode == 0
    file.write_text(
        PROJECTORS_FILE
        + '\n[[projector]]\nname = "sql"\nversion = 2\nevents = ["add"]\n'
        + 'function = "app.add_sql_v2"\n'
    )
    built = run_cli(
        "maintenance", "projections-rebuild", "--app", str(file), "--projector", "sql",
        "--as-version", "2", "--yes", dsn=dsn,
    )  # fmt: skip
    assert built.returncode == 0, built.stderr
    assert await sums(pool, "sql@v2") == expected
    # The workers rolled onto the file with version 2 (they record it), then the promotion.
    assert run_cli("outbox-worker", "--projectors", str(file), "--drain", dsn=dsn).returncode == 0
    promoted = run_cli("maintenance", "projector-promote", "sql", "--version", "2", dsn=dsn)
    assert promoted.returncode == 0, promoted.stderr
    assert await pool.fetchval("SELECT outbox.outbox_live_version('sql')") == 2
    for cid in CAMPAIGNS[:2]:  # the live version 2 goes on; version 1 is owed nothing now
        await add_events(pool, settings, expected, cid, [1])
    assert run_cli("outbox-worker", "--projectors", str(file), "--drain", dsn=dsn).returncode == 0
    assert await sums(pool, "sql@v2") == expected


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("", "no projectors: add a [[projector]] table"),
        ("[[projector]]\nname = 'x'\nevents = ['add']\n", "projector 1 ('x'): function is req"),
        (PROJECTORS_FILE + "ordred = true\n", "unknown key 'ordred'"),
        (PROJECTORS_FILE + "version = '2'\n", "version must be a whole number, got '2'"),
        (PROJECTORS_FILE.replace('"app.add_sql"', '"app.add-sql"'), "function must name a func"),
        (PROJECTORS_FILE + "start = 'later'\n", "start must be 'beginning' or 'now'"),
        ("[[projector]\n", "not valid TOML"),
        ("extra = 1\n" + PROJECTORS_FILE, "unknown top-level key 'extra'"),
    ],
)
def test_a_bad_projectors_file_is_one_line_naming_what_is_wrong(
    tmp_path: Path, text: str, error: str
) -> None:
    file = tmp_path / "projectors.toml"
    file.write_text(text)
    with pytest.raises(ConfigError, match=r"projectors\.toml: ") as raised:
        load_projectors(file)
    assert error in str(raised.value)
    assert "\n" not in str(raised.value)


async def test_the_worker_refuses_a_function_the_database_lacks(dsn: str, tmp_path: Path) -> None:
    file = tmp_path / "projectors.toml"
    file.write_text(PROJECTORS_FILE.replace("app.reset_sql", "app.nope"))
    refused = run_cli("outbox-worker", "--projectors", str(file), "--drain", dsn=dsn)
    assert refused.returncode == 2
    assert refused.stderr.strip().splitlines() == [
        "outbox-worker: error: no such function in the database: app.nope(text) (projector 'sql')"
    ]
    missing = run_cli("outbox-worker", "--projectors", str(tmp_path / "absent.toml"), dsn=dsn)
    assert missing.returncode == 2
    assert "cannot read the projectors file" in missing.stderr
    both = run_cli("outbox-worker", "--projectors", str(file), "--app", "x:app", dsn=dsn)
    assert (both.returncode, "exclude each other" in both.stderr) == (2, True)
