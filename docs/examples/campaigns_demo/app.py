"""The demo app: projectors of the campaigns domain (`outbox-worker --app campaigns_demo.app:app`).

- `roster` (ordered): who is in each campaign.
- `event_counts` (ordered, batch=True): events per campaign and type, one set-based upsert
  per claimed batch.
- `dice_totals` (unordered, idempotent=True): an additive sum, guarded by processed markers;
  the tests compare it with counts taken from the journal.
- `curse` (ordered): subscribes to `dice.cursed` and always fails, so there is work to retry
  and dead-letter.
The read-model tables are created by `install()` (the demo's own schema, not the outbox's).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from campaigns_demo import campaigns as c
from outbox.db import Connection, Executor, acquire
from outbox.model import EventBatch, StoredEvent
from outbox.projection.app import Outbox

__all__ = ["CursedDice", "app", "build_app", "install"]

SCHEMA = """
CREATE TABLE IF NOT EXISTS demo_roster (
    campaign_id text NOT NULL, character text NOT NULL, class text,
    PRIMARY KEY (campaign_id, character)
);
CREATE TABLE IF NOT EXISTS demo_event_counts (
    campaign_id text NOT NULL, event_type text NOT NULL, events bigint NOT NULL,
    PRIMARY KEY (campaign_id, event_type)
);
CREATE TABLE IF NOT EXISTS demo_dice_totals (
    campaign_id text PRIMARY KEY, rolls bigint NOT NULL, total bigint NOT NULL
);
"""


class CursedDice(Exception):
    """What the `curse` projector always raises."""


async def install(executor: Executor) -> None:
    async with acquire(executor) as conn:
        await conn.execute(SCHEMA)


def _resetter(table: str) -> Callable[[Connection, str], Awaitable[None]]:
    # The table name is one of this module's constants, never input.
    sql = f"DELETE FROM {table} WHERE campaign_id = $1"

    async def reset(tx: Connection, campaign_id: str) -> None:
        await tx.execute(sql, campaign_id)

    return reset


def build_app(app: Outbox | None = None) -> Outbox:
    app = app if app is not None else Outbox()

    @app.projector(
        "roster", events=[c.CHARACTER_JOINED, c.CHARACTER_LEFT], reset=_resetter("demo_roster")
    )
    async def roster(tx: Connection, event: StoredEvent) -> None:
        if event.type == c.CHARACTER_JOINED:
            await tx.execute(
                "INSERT INTO demo_roster (campaign_id, character, class) VALUES ($1, $2, $3) "
                "ON CONFLICT (campaign_id, character) DO UPDATE SET class = excluded.class",
                event.campaign_id,
                event.payload["character"],
                event.payload.get("class"),
            )
        else:
            await tx.execute(
                "DELETE FROM demo_roster WHERE campaign_id = $1 AND character = $2",
                event.campaign_id,
                event.payload["character"],
            )

    @app.projector(
        "event_counts",
        events=[t for t in c.EVENT_TYPES if t != c.DICE_CURSED],
        reset=_resetter("demo_event_counts"),
        batch=True,
    )
    async def event_counts(tx: Connection, events: EventBatch) -> None:
        # Every event of the batch this projector's checkpoints let through, in one statement,
        # from the batch's columns (no object per event).
        await tx.execute(
            "INSERT INTO demo_event_counts AS d (campaign_id, event_type, events) "
            "SELECT e.campaign_id, e.event_type, count(*) "
            "FROM unnest($1::text[], $2::text[]) AS e(campaign_id, event_type) "
            "GROUP BY 1, 2 ORDER BY 1, 2 "
            "ON CONFLICT (campaign_id, event_type) "
            "DO UPDATE SET events = d.events + excluded.events",
            events.campaign_ids,
            events.types,
        )

    @app.projector(
        "dice_totals",
        events=[c.DICE_ROLLED],
        ordered=False,
        idempotent=True,
        reset=_resetter("demo_dice_totals"),
    )
    async def dice_totals(tx: Connection, event: StoredEvent) -> None:
        await tx.execute(
            "INSERT INTO demo_dice_totals (campaign_id, rolls, total) VALUES ($1, 1, $2) "
            "ON CONFLICT (campaign_id) DO UPDATE SET rolls = demo_dice_totals.rolls + 1, "
            "total = demo_dice_totals.total + excluded.total",
            event.campaign_id,
            event.payload["value"],
        )

    @app.projector("curse", events=[c.DICE_CURSED])
    async def curse(tx: Connection, event: StoredEvent) -> None:
        raise CursedDice(f"a {event.payload.get('sides')}-sided die cannot be projected")

    return app


app = build_app()
