"""Apps the worker subprocess tests load with `--app worker_apps:<name>` (cwd = tests/)."""

from __future__ import annotations

import logging

from helpers import ADD
from outbox import PermanentError, db, running_projector
from outbox.model import EventBatch, StoredEvent
from outbox.projection.app import Outbox

# The test holds this advisory lock to freeze a projector mid-batch.
FREEZE_LOCK = 4242

blocking = Outbox()


@blocking.projector("counted", events=["tick"])
async def counted(tx: db.Connection, event: StoredEvent) -> None:
    await tx.execute("SELECT pg_advisory_xact_lock($1)", FREEZE_LOCK)
    await tx.execute(
        "INSERT INTO applied (campaign_id, seq) VALUES ($1, $2)", event.campaign_id, event.seq
    )


not_an_app = object()


# Lease mode (S13): `notify` is non-transactional; it records its delivery on its own
# connection (an external system's call log), then waits on FREEZE_LOCK, so a test can kill or
# stop the worker after the side effect and before the completion. `ledger` is transactional.
leasing = Outbox()


@leasing.projector("notify", events=["tick"], transactional=False)
async def notify(pool: db.Pool, event: StoredEvent) -> None:
    await pool.execute(
        "INSERT INTO deliveries (campaign_id, seq) VALUES ($1, $2)", event.campaign_id, event.seq
    )
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock($1)", FREEZE_LOCK)


@leasing.projector("ledger", events=["tick"])
async def ledger(tx: db.Connection, event: StoredEvent) -> None:
    await tx.execute(
        "INSERT INTO applied (campaign_id, seq) VALUES ($1, $2)", event.campaign_id, event.seq
    )


# `--drain` until the work is done: `flaky` fails every event's first attempt (a backoff to
# wait out) and makes `poison` events dead at once (a dead head for its campaign).
flaky = Outbox()


@flaky.projector("flaky", events=["tick", "poison"])
async def flaky_tick(tx: db.Connection, event: StoredEvent) -> None:
    if event.type == "poison":
        raise PermanentError("poisoned on purpose")
    attempts = await tx.fetchval(
        "SELECT attempt_count FROM outbox.projection_apply_outbox WHERE campaign_id = $1 AND "
        "seq = $2",
        event.campaign_id,
        event.seq,
    )
    if attempts == 0:
        raise RuntimeError("the first attempt always fails")
    await tx.execute(
        "INSERT INTO applied (campaign_id, seq) VALUES ($1, $2)", event.campaign_id, event.seq
    )


# Logs through the application's own logger, then waits on FREEZE_LOCK (a shutdown cancels it).
chatty = Outbox()


@chatty.projector("chatty", events=["tick"])
async def chatty_tick(tx: db.Connection, event: StoredEvent) -> None:
    logging.getLogger("myapp.projections").warning("user.note", extra={"seq": event.seq})
    await tx.execute("SELECT pg_advisory_xact_lock($1)", FREEZE_LOCK)


# The console's incident (tests/browser): `totals` adds each order's amount to its campaign's
# total and raises on a negative amount until the fix is deployed (`shop_flags.fixed`, read at
# apply time, as a feature flag would be). Ordered: a dead order blocks its campaign.
shop = Outbox()


@shop.projector("totals", events=["order.placed"])
async def shop_totals(tx: db.Connection, event: StoredEvent) -> None:
    amount = event.payload["amount"]
    if amount < 0 and not await tx.fetchval("SELECT fixed FROM shop_flags"):
        raise ValueError(f"negative amount {amount} in order {event.seq}")
    await tx.execute(
        "INSERT INTO shop_totals AS t (campaign_id, total, orders) VALUES ($1, $2, 1) "
        "ON CONFLICT (campaign_id) DO UPDATE SET total = t.total + $2, orders = t.orders + 1",
        event.campaign_id,
        abs(amount),
    )


# Versions (S29, S30): `tally` in two versions, one batch function for both, each adding its
# version times `n` under its own key into `sums` (tests/helpers.py SUMS).
versioned = Outbox()


async def tally(tx: db.Connection, events: EventBatch) -> None:
    me = running_projector()
    pairs = zip(events.campaign_ids, events.payloads, strict=True)
    rows = [(me.name, c, p["n"] * me.version) for c, p in pairs]
    await tx.executemany(ADD, rows)


versioned.projector("tally", events=["add"], batch=True)(tally)
versioned.projector("tally", events=["add"], batch=True, version=2)(tally)


async def untally(tx: db.Connection, campaign_id: str) -> None:
    """`tally`'s reset hook: the campaign's sum under the running version's key, gone."""
    me = running_projector()
    await tx.execute(
        "DELETE FROM sums WHERE projector = $1 AND campaign_id = $2", me.name, campaign_id
    )


# A rebuild in place (S19 on the engine, S30): `tally` with its reset hook.
rebuilt = Outbox()
rebuilt.projector("tally", events=["add"], batch=True, reset=untally)(tally)
