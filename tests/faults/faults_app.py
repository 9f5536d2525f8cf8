"""The app the fault tier's worker processes run (`--app faults_app:app`, cwd = tests/faults).

One projector, `witness`, unguarded (no checkpoint, no marker): exactly-once rests on the
queue's transaction alone; `batch_app` has the same witness as a batch projector (one
statement per claimed batch). It writes one row per application with the generator's own
`uid` and per-campaign index `i`, in apply order (`id`); the oracle compares that with what
the generator recorded, never with the journal or the queue. `mystery` events have no
projector: the unknown-type poison. `lease_app` (lease mode, S13) adds `courier`, a
non-transactional projector of every `step` that records each delivery on its own connection
(`fault_delivered`: at-least-once, so repeats are counted, never lost or out of order), while
`witness` applies in each lease's fenced completion (exactly once).
"""

from __future__ import annotations

from collections.abc import Sequence

from outbox import db
from outbox.model import StoredEvent
from outbox.projection.app import Outbox

SCHEMA = """
CREATE TABLE IF NOT EXISTS fault_applied (
    id          bigserial PRIMARY KEY,
    campaign_id text   NOT NULL,
    uid         text   NOT NULL,
    i           bigint NOT NULL
);
CREATE TABLE IF NOT EXISTS fault_delivered (
    id          bigserial PRIMARY KEY,
    campaign_id text   NOT NULL,
    uid         text   NOT NULL,
    i           bigint NOT NULL
);
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
