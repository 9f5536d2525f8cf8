"""docs/examples/fastapi_app.py, the FastAPI example of docs/worker.md, run as written: the
worker in the lifespan LISTENs with no OUTBOX_DSN (on a connection of the app's pool), its
sessions carry the worker's timeouts and name on a pool made without them, a request reads
its own write, and a failing projector logs what failed and where in both log formats."""

from __future__ import annotations

import importlib.util
import io
import logging
from types import ModuleType

import anyio
import httpx
import orjson
import pytest

import outbox
from helpers import ROOT
from outbox import Event, db
from outbox.obs.log import JsonFormatter, TextFormatter

TABLES = """
CREATE TABLE orders (id text PRIMARY KEY, customer text NOT NULL);
CREATE TABLE order_counts (customer text PRIMARY KEY, orders int NOT NULL);
CREATE TABLE seen_sessions (statement_timeout text, lock_timeout text,
                            idle_timeout text, application_name text);
"""


def load_example() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "fastapi_app", ROOT / "docs" / "examples" / "fastapi_app.py"
    )
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


async def test_the_fastapi_example_runs_as_documented(
    pool: db.Pool, dsn: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.delenv("OUTBOX_DSN", raising=False)
    monkeypatch.setenv("APP_DSN", dsn)
    await pool.execute(TABLES)
    example = load_example()
    app: outbox.Outbox = example.projections
    assert app.settings.dsn is None  # nothing tells the worker where to LISTEN

    @app.projector("probe", events=["order.placed"], ordered=False)
    async def probe(tx: db.Connection, event: outbox.StoredEvent) -> None:
        await tx.execute(
            "INSERT INTO seen_sessions SELECT current_setting('statement_timeout'), "
            "current_setting('lock_timeout'), "
            "current_setting('idle_in_transaction_session_timeout'), "
            "current_setting('application_name')"
        )

    @app.projector("wrapping", events=["gift.wrapped"])
    async def wrapping(tx: db.Connection, event: outbox.StoredEvent) -> None:
        raise KeyError("ribbon")

    async with example.api.router.lifespan_context(example.api):
        worker = example.api.state.worker
        with anyio.fail_after(30):
            await worker.wait_listening()
        transport = httpx.ASGITransport(app=example.api)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            first = (await client.post("/customers/ada/orders/o-1")).json()
            second = (await client.post("/customers/ada/orders/o-2")).json()
        with caplog.at_level(logging.DEBUG, logger="outbox"):
            await outbox.append(pool, "wrap-1", [Event("gift.wrapped", {})])
            with anyio.fail_after(30):
                await worker.signals.batch_done.wait_until(lambda: worker.totals.failed >= 1)
    assert first == {"order": "o-1", "applied": True, "customer_orders": 1}
    assert second == {"order": "o-2", "applied": True, "customer_orders": 2}
    sessions = {tuple(r) for r in await pool.fetch("SELECT * FROM seen_sessions")}
    assert sessions == {("30s", "5s", "1min", "outbox-worker")}
    (failed,) = [r for r in caplog.records if getattr(r, "event", "") == "apply.failed"]
    as_json = orjson.loads(JsonFormatter().format(failed))
    assert {k: as_json[k] for k in ("event", "campaign_id", "seq", "projector")} == {
        "event": "apply.failed",
        "campaign_id": "wrap-1",
        "seq": 1,
        "projector": "wrapping",
    }
    assert as_json["error"] == "projector 'wrapping': KeyError: 'ribbon'"
    as_text = TextFormatter().format(failed)
    for field in ("apply.failed", "campaign_id=wrap-1", "seq=1", "projector=wrapping"):
        assert field in as_text, as_text
    assert "KeyError" in as_text
    # At debug the traceback follows on lines of its own, indented under the record's line.
    first_line, *trace = TextFormatter(tracebacks=True).format(failed).splitlines()
    assert "apply.failed" in first_line
    assert "traceback=" not in first_line
    assert trace[0] == "    Traceback (most recent call last):", trace
    assert trace[-1] == "    KeyError: 'ribbon'"
    assert all(line.startswith("    ") for line in trace)
    # Any other handler sees the facts in the message itself.
    plain = io.StringIO()
    handler = logging.StreamHandler(plain)
    handler.handle(failed)
    assert "campaign_id='wrap-1' seq=1 projector='wrapping'" in plain.getvalue()
