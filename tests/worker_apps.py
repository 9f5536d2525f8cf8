"""Apps the worker subprocess tests load with `--app worker_apps:<name>` (cwd = tests/)."""

from __future__ import annotations

from outbox import db
from outbox.journal import StoredEvent
from outbox.projectors import Outbox

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
