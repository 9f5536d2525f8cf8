"""The bench's outbox apps: the same per-campaign totals as every contender, kept by a batch
projector (one upsert per batch), a per-event projector (one upsert per event) or a statement
projector (the per-event upsert, pipelined).

`outbox-worker --app _apps:batch_app` (run from bench/) builds them from the environment.
"""

from __future__ import annotations

import os

from _support import EVENT_TYPE, UPSERT_MANY, UPSERT_ONE

from outbox import EventBatch, Outbox, Settings, StoredEvent, db, running_projector

# The ways a projector can keep the totals: one upsert per batch, one upsert per event
# (awaited one by one), one upsert statement per event sent together (`app.statement`), the
# batch's upsert in a SQL function given the events as JSON (`app.sql_projector`).
KINDS = ("batch", "per-event", "statement", "sql")


def outbox_app(
    settings: Settings | None = None,
    *,
    kind: str,
    upsert_many: str = UPSERT_MANY,
    upsert_one: str = UPSERT_ONE,
) -> Outbox:
    """The totals kept by a `kind` projector, with the bench's upserts (or others taking the
    same arguments: bench/cluster.py's bucketed table)."""
    app = Outbox(settings)
    if kind == "batch":

        @app.projector("totals", events=[EVENT_TYPE], batch=True)
        async def totals_batch(tx: db.Connection, events: EventBatch) -> None:
            # The columns it needs: no object per event.
            await tx.execute(
                upsert_many, events.campaign_ids, [p["amount"] for p in events.payloads]
            )

    elif kind == "sql":
        app.sql_projector("totals", events=[EVENT_TYPE], function="public.bench_totals_apply")

    elif kind == "per-event":

        @app.projector("totals", events=[EVENT_TYPE])
        async def totals_one(tx: db.Connection, event: StoredEvent) -> None:
            await tx.execute(upsert_one, event.campaign_id, event.payload["amount"])

    else:

        @app.statement("totals", events=[EVENT_TYPE], sql=upsert_one)
        def totals_args(event: StoredEvent) -> tuple[str, int]:
            return (event.campaign_id, event.payload["amount"])

    return app


def __getattr__(name: str) -> Outbox:
    """`batch_app`, `per_event_app`, `statement_app`, `sql_app`, `visible`, `visible_sql`,
    `mixed_sql`, `isolated`, `catching_up` (built on first use: the settings come from the
    environment the worker process was started with)."""
    kinds = {
        "batch_app": "batch",
        "per_event_app": "per-event",
        "statement_app": "statement",
        "sql_app": "sql",
    }
    if name in kinds:
        return outbox_app(kind=kinds[name])
    if name == "visible":
        return visible_app()
    if name == "visible_sql":
        return visible_sql_app()
    if name == "mixed_sql":
        return mixed_sql_app()
    if name == "isolated":
        return isolated_app()
    if name == "catching_up":
        return catching_up_app()
    if name == "versioned":
        return versioned_app(versions=(1, 2))
    if name == "versioned_v1":
        return versioned_app(versions=(1,))
    raise AttributeError(name)


def marked_table(table: str) -> str:
    """`table` (a row per applied event) and `public.<table>_mark(events jsonb)`, a SQL
    projector's function filling it."""
    return f"""
CREATE TABLE IF NOT EXISTS {table} (
    campaign_id text NOT NULL,
    seq         bigint NOT NULL,
    PRIMARY KEY (campaign_id, seq)
);
CREATE OR REPLACE FUNCTION public.{table}_mark(events jsonb) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO public.{table} (campaign_id, seq)
    SELECT e->>'campaign_id', (e->>'seq')::bigint FROM jsonb_array_elements(events) AS e;
END
$$;
"""


VISIBLE = marked_table("bench_visible")
MARK_VISIBLE = """
INSERT INTO bench_visible (campaign_id, seq)
SELECT * FROM unnest($1::text[], $2::bigint[])
"""


def visible_app(settings: Settings | None = None) -> Outbox:
    """One row per applied event, whose commit timestamp says when it became visible."""
    app = Outbox(settings)

    @app.projector("visible", events=[EVENT_TYPE], batch=True)
    async def visible(tx: db.Connection, events: EventBatch) -> None:
        await tx.execute(MARK_VISIBLE, events.campaign_ids, events.seqs)

    return app


def visible_sql_app(settings: Settings | None = None) -> Outbox:
    """`visible_app` with its projector in SQL (`bench_visible_mark`, VISIBLE's function)."""
    app = Outbox(settings)
    app.sql_projector("visible", events=[EVENT_TYPE], function="public.bench_visible_mark")
    return app


# bench/mixed_fleet.py: a SQL projector of its own (`visible_sql`) beside `visible`, run by a
# worker of its own, as a team with a Python service and a SQL one deploys them.
MIXED = marked_table("bench_visible_sql")


def mixed_sql_app(settings: Settings | None = None) -> Outbox:
    """`visible_sql`: one row per applied event in `bench_visible_sql`, in SQL."""
    app = Outbox(settings)
    app.sql_projector("visible_sql", events=[EVENT_TYPE], function="public.bench_visible_sql_mark")
    return app


# bench/isolation.py: ten projectors on every event; one of them (`flaky`, per event) fails
# every event of one campaign in ten when BENCH_FAIL=1 (until it is dead on it).
HEALTHY = 9
COUNTED = """
CREATE TABLE IF NOT EXISTS bench_counted (
    projector   text NOT NULL,
    campaign_id text NOT NULL,
    n           bigint NOT NULL,
    PRIMARY KEY (projector, campaign_id)
)
"""
COUNT_MANY = """
INSERT INTO bench_counted AS t (projector, campaign_id, n)
SELECT $1, c, count(*) FROM unnest($2::text[]) AS e(c) GROUP BY c
ON CONFLICT (projector, campaign_id) DO UPDATE SET n = t.n + excluded.n
"""


def isolated_app(settings: Settings | None = None) -> Outbox:
    """`visible` (one row per event: its commit says when it became visible), eight more
    healthy batch projectors counting events per campaign, and `flaky`."""
    app = visible_app(settings)
    for k in range(1, HEALTHY):

        async def count(tx: db.Connection, events: EventBatch, name: str = f"count-{k}") -> None:
            await tx.execute(COUNT_MANY, name, events.campaign_ids)

        app.projector(f"count-{k}", events=[EVENT_TYPE], batch=True)(count)
    failing = os.environ.get("BENCH_FAIL") == "1"

    @app.projector("flaky", events=[EVENT_TYPE])
    async def flaky(tx: db.Connection, event: StoredEvent) -> None:
        if failing and event.campaign_id.endswith("0"):
            raise RuntimeError(f"flaky on {event.campaign_id}")

    return app


def catching_up_app(settings: Settings | None = None) -> Outbox:
    """`visible`, and `totals` deployed beside it: the bench's per-event upsert as a statement
    projector, ordered, starting at the beginning (bench/catch_up.py)."""
    app = visible_app(settings)

    @app.statement("totals", events=[EVENT_TYPE], sql=UPSERT_ONE)
    def totals_args(event: StoredEvent) -> tuple[str, int]:
        return (event.campaign_id, event.payload["amount"])

    return app


def versioned_app(settings: Settings | None = None, *, versions: tuple[int, ...]) -> Outbox:
    """`visible`, and `totals` in `versions`: one batch function for every version, the
    bench's set-wise upsert into the running version's table, `bench_totals_v<N>`
    (bench/build.py)."""
    app = visible_app(settings)
    upserts = {v: UPSERT_MANY.replace("bench_totals", f"bench_totals_v{v}") for v in versions}

    async def totals(tx: db.Connection, events: EventBatch) -> None:
        upsert = upserts[running_projector().version]
        await tx.execute(upsert, events.campaign_ids, [p["amount"] for p in events.payloads])

    for version in versions:
        app.projector("totals", events=[EVENT_TYPE], batch=True, version=version)(totals)
    return app
