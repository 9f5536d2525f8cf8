"""The app the fault tier's worker processes run (`--app faults_app:app`, cwd = tests/faults).

One projector, `witness`, unguarded (no checkpoint, no marker): exactly-once rests on the
queue's transaction alone; `batch_app` has the same witness as a batch projector (one
statement per claimed batch). It writes one row per application with the generator's own
`uid` and per-campaign index `i`, in apply order (`id`); the oracle compares that with what
the generator recorded, never with the journal or the queue. `mystery` events have no
projector: the unknown-type poison. `lease_app` (lease mode, S13) adds `courier`, a
non-transactional projector of every `step` that records each delivery on its own connection
(`fault_delivered`: at-least-once, so repeats are counted, never lost or out of order), while
`witness` applies in each lease's fenced completion (exactly once). `tracks_app` (S24) adds
two ordered projectors, `ledger` and `flaky`, each recording its applications under its name
(`fault_tracked`); `flaky` raises on every event of a campaign listed in `fault_sick` for as
long as it is listed. `catch_up_app` (S25) adds `late`, ordered and starting at the beginning,
deployed onto a journal with history (a millisecond per event, so a catch-up lasts long
enough for kills to land in it). `versions_app` (S29, S30) has `ledger` in two versions, each
recording under its track's key (`ledger`, `ledger@v2`): version 2 is built by the catch-up
engine beside version 1 and promoted; `ledger_app` is version 1 alone, the app before it.
`changed_app` ships a changed `ledger` (a batch projector that also subscribes to `note`) as
version 2 beside version 1, as S33 says a change of what a projector owes ships;
`drifted_app` changes version 1 in place (`ordered=False`), and a worker of it is refused.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from outbox import db, running_projector
from outbox.model import StoredEvent
from outbox.projection.app import Outbox

SCHEMA = """
CREATE TABLE IF NOT EXISTS fault_applied (
    id          bigserial PRIMARY KEY,
    campaign_id text   NOT NULL,
    uid         text   NOT NULL,
    i           bigint NOT NULL
);
CREATE TABLE IF NOT EXISTS fault_tracked (
    id          bigserial PRIMARY KEY,
    projector   text   NOT NULL,
    campaign_id text   NOT NULL,
    uid         text   NOT NULL,
    i           bigint NOT NULL
);
CREATE TABLE IF NOT EXISTS fault_sick (campaign_id text PRIMARY KEY);
CREATE TABLE IF NOT EXISTS fault_delivered (
    id          bigserial PRIMARY KEY,
    campaign_id text   NOT NULL,
    uid         text   NOT NULL,
    i           bigint NOT NULL
);
-- sql_projectors.toml's projectors: the witness, `ledger` and `marked` as SQL functions.
CREATE OR REPLACE FUNCTION public.fault_witness(events jsonb) RETURNS void LANGUAGE sql AS $$
    INSERT INTO public.fault_applied (campaign_id, uid, i)
    SELECT e->>'campaign_id', e->'payload'->>'uid', (e->'payload'->>'i')::bigint
    FROM jsonb_array_elements(events) WITH ORDINALITY AS x(e, ord) ORDER BY ord
$$;
CREATE OR REPLACE FUNCTION public.fault_ledger(events jsonb) RETURNS void LANGUAGE sql AS $$
    INSERT INTO public.fault_tracked (projector, campaign_id, uid, i)
    SELECT 'ledger', e->>'campaign_id', e->'payload'->>'uid', (e->'payload'->>'i')::bigint
    FROM jsonb_array_elements(events) WITH ORDINALITY AS x(e, ord) ORDER BY ord
$$;
CREATE OR REPLACE FUNCTION public.fault_marked(events jsonb) RETURNS void LANGUAGE sql AS $$
    INSERT INTO public.fault_tracked (projector, campaign_id, uid, i)
    SELECT 'marked', e->>'campaign_id', e->'payload'->>'uid', (e->'payload'->>'i')::bigint
    FROM jsonb_array_elements(events) WITH ORDINALITY AS x(e, ord) ORDER BY ord
$$;
"""

app = Outbox()


@app.projector("witness", events=["step"], ordered=False)
async def witness(tx: db.Connection, event: StoredEvent) -> None:
    await tx.execute(
        "INSERT INTO fault_applied (campaign_id, uid, i) VALUES ($1, $2, $3)",
        event.campaign_id,
        event.payload["uid"],
        event.payload["i"],
    )


batch_app = Outbox()


@batch_app.projector("witness", events=["step"], ordered=False, batch=True)
async def batch_witness(tx: db.Connection, events: Sequence[StoredEvent]) -> None:
    await tx.execute(
        "INSERT INTO fault_applied (campaign_id, uid, i) "
        "SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[])",
        [e.campaign_id for e in events],
        [e.payload["uid"] for e in events],
        [e.payload["i"] for e in events],
    )


lease_app = Outbox()
lease_app.registry.add(app.registry.projectors["witness"])


@lease_app.projector("courier", events=["step"], transactional=False)
async def courier(pool: db.Pool, event: StoredEvent) -> None:
    await pool.execute(
        "INSERT INTO fault_delivered (campaign_id, uid, i) VALUES ($1, $2, $3)",
        event.campaign_id,
        event.payload["uid"],
        event.payload["i"],
    )


TRACK = "INSERT INTO fault_tracked (projector, campaign_id, uid, i) VALUES ($1, $2, $3, $4)"


async def _track(tx: db.Connection, name: str, event: StoredEvent) -> None:
    await tx.execute(TRACK, name, event.campaign_id, event.payload["uid"], event.payload["i"])


tracks_app = Outbox()
tracks_app.registry.add(app.registry.projectors["witness"])


@tracks_app.projector("ledger", events=["step"])
async def ledger(tx: db.Connection, event: StoredEvent) -> None:
    await _track(tx, "ledger", event)


class Sick(Exception):
    """`flaky` on a campaign listed in `fault_sick`."""


@tracks_app.projector("flaky", events=["step"])
async def flaky(tx: db.Connection, event: StoredEvent) -> None:
    sick = "SELECT EXISTS (SELECT 1 FROM fault_sick WHERE campaign_id = $1)"
    if await tx.fetchval(sick, event.campaign_id):
        raise Sick(f"flaky is sick on {event.campaign_id}")
    await _track(tx, "flaky", event)


catch_up_app = Outbox()
catch_up_app.registry.add(app.registry.projectors["witness"])


@catch_up_app.projector("late", events=["step"], start="beginning")
async def late(tx: db.Connection, event: StoredEvent) -> None:
    await asyncio.sleep(0.001)
    await _track(tx, "late", event)


ledger_app = Outbox()
ledger_app.registry.add(app.registry.projectors["witness"])
ledger_app.registry.add(tracks_app.registry.projectors["ledger"])
versions_app = Outbox()
versions_app.registry.add(app.registry.projectors["witness"])
versions_app.registry.add(tracks_app.registry.projectors["ledger"])


@versions_app.projector("ledger", events=["step"], version=2)
async def ledger_v2(tx: db.Connection, event: StoredEvent) -> None:
    await _track(tx, running_projector().name, event)


changed_app = Outbox()
changed_app.registry.add(app.registry.projectors["witness"])
changed_app.registry.add(tracks_app.registry.projectors["ledger"])


@changed_app.projector("ledger", events=["step", "note"], batch=True, version=2)
async def ledger_changed(tx: db.Connection, events: Sequence[StoredEvent]) -> None:
    for event in events:
        if event.type == "step":
            await _track(tx, running_projector().name, event)


drifted_app = Outbox()
drifted_app.registry.add(app.registry.projectors["witness"])


@drifted_app.projector("ledger", events=["step"], ordered=False)
async def ledger_unordered(tx: db.Connection, event: StoredEvent) -> None:
    await _track(tx, "ledger", event)


# A worker group's app (S35): `ledger` alone, run with `--group fast` beside workers of `app`
# (the default group, `witness`).
group_app = Outbox()
group_app.registry.add(tracks_app.registry.projectors["ledger"])
