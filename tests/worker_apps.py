"""Apps the worker subprocess tests load with `--app worker_apps:<name>` (cwd = tests/)."""

from __future__ import annotations

import logging

from outbox import PermanentError, db
from outbox.model import StoredEvent
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
        "SELECT attempt_count FROM projection_apply_outbox WHERE campaign_id = $1 AND seq = $2",
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
