"""A FastAPI service with the outbox worker in its lifespan (docs/worker.md).

    APP_DSN=postgresql://app@db/app uvicorn fastapi_app:api

The append joins the request's transaction; the worker runs in the same process on the
application's own pool (LISTEN on one of its connections: no OUTBOX_DSN needed) with the
worker's session timeouts; the handler reads its own write before answering.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator

from fastapi import FastAPI

import outbox

projections = outbox.Outbox()


@projections.projector("order_counts", events=["order.placed"])
async def order_counts(tx: outbox.Connection, event: outbox.StoredEvent) -> None:
    await tx.execute(
        "INSERT INTO order_counts (customer, orders) VALUES ($1, 1) "
        "ON CONFLICT (customer) DO UPDATE SET orders = order_counts.orders + 1",
        event.payload["customer"],
    )


@contextlib.asynccontextmanager
async def lifespan(api: FastAPI) -> AsyncIterator[None]:
    api.state.pool = await outbox.create_pool(os.environ["APP_DSN"])
    try:
        async with outbox.running_worker(projections, api.state.pool) as worker:
            api.state.worker = worker
            yield  # requests are served; the worker applies meanwhile, and stops first
    finally:
        await api.state.pool.close()


api = FastAPI(lifespan=lifespan)


@api.post("/customers/{customer}/orders/{order_id}")
async def place_order(customer: str, order_id: str) -> dict[str, object]:
    pool = api.state.pool
    async with pool.acquire() as conn, conn.transaction():
        placed = await outbox.append(  # first, keyed: a client's retry answers duplicate
            conn,
            f"order-{order_id}",
            [outbox.Event("order.placed", {"customer": customer})],
            idempotency_key=f"place-{order_id}",
        )
        if not placed.duplicate:
            await conn.execute(
                "INSERT INTO orders (id, customer) VALUES ($1, $2)", order_id, customer
            )
    applied = await outbox.wait_applied(pool, placed.campaign_id, placed.last_seq, timeout=5)
    if not applied:  # says why: still pending, or blocked by a failed or dead row
        return {"order": order_id, "applied": False, "state": applied.state}
    orders = await pool.fetchval("SELECT orders FROM order_counts WHERE customer = $1", customer)
    return {"order": order_id, "applied": True, "customer_orders": orders}
