"""Testing the FastAPI example with `outbox.testing`: a migrated throwaway database per test,
`drain_now` where no worker runs, and an empty queue at the end (docs/worker.md, testing).

    OUTBOX_TEST_DSN=postgresql://me@localhost/postgres pytest test_fastapi_app.py
"""

from __future__ import annotations

import httpx
import pytest
from fastapi_app import api, projections

import outbox
from outbox.testing import assert_queue_empty

pytest_plugins = ["outbox.testing"]

SCHEMA = """
CREATE TABLE orders (id text PRIMARY KEY, customer text NOT NULL);
CREATE TABLE order_counts (customer text PRIMARY KEY, orders int NOT NULL);
"""


async def test_a_placed_order_is_counted_before_the_answer(
    outbox_pool: outbox.Pool, outbox_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    await outbox_pool.execute(SCHEMA)
    monkeypatch.setenv("APP_DSN", outbox_dsn)
    async with api.router.lifespan_context(api):  # the worker runs in the app's lifespan
        transport = httpx.ASGITransport(app=api)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            answer = (await client.post("/customers/ada/orders/o-1")).json()
            retried = (await client.post("/customers/ada/orders/o-1")).json()  # the same request
    assert answer == {"order": "o-1", "applied": True, "customer_orders": 1}
    assert retried == answer  # a duplicate: nothing written twice, nothing counted twice
    await assert_queue_empty(outbox_pool)


async def test_without_a_worker_drain_now_applies_what_is_due(outbox_pool: outbox.Pool) -> None:
    await outbox_pool.execute(SCHEMA)
    placed = outbox.Event("order.placed", {"customer": "bo"})
    await outbox.append(outbox_pool, "order-o-2", [placed])
    with pytest.raises(AssertionError, match="1 work row"):
        await assert_queue_empty(outbox_pool)  # appended, not applied yet
    counts = await outbox.drain_now(projections, outbox_pool)
    assert counts.applied == 1
    await assert_queue_empty(outbox_pool)
    assert await outbox_pool.fetchval("SELECT orders FROM order_counts") == 1
