"""Tracing from an append to its apply (outbox.obs.tracing) with the OpenTelemetry SDK
recording in memory: the append records its span's context in each event's metadata, the
worker's batch and projector spans link to it; outside a span nothing is written."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.util._once import Once

from helpers import campaigns_in_one_bucket
from outbox import Event, Settings, db
from outbox.model import StoredEvent
from outbox.projection.app import Outbox
from outbox.worker.batch import Worker


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """A global SDK provider for this test, taken away after it: the API allows setting the
    provider once per process, so the test resets its globals (as OpenTelemetry's own test
    utilities do) and the rest of the suite runs untraced."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    try:
        yield exporter
    finally:
        provider.shutdown()
        trace._TRACER_PROVIDER = None
        trace._TRACER_PROVIDER_SET_ONCE = Once()


def orders(dsn: str) -> Outbox:
    app = Outbox(Settings(dsn=dsn))

    @app.projector("totals", events=["order.placed"], batch=True)
    async def totals(tx: db.Connection, events: list[StoredEvent]) -> None:
        return None

    return app


async def test_an_apply_links_to_the_append_that_wrote_it(
    pool: db.Pool, dsn: str, spans: InMemorySpanExporter
) -> None:
    app = orders(dsn)
    o1, o2, o3 = campaigns_in_one_bucket(3, "o")  # one batch claims them all
    tracer = trace.get_tracer("test")
    with tracer.start_as_current_span("checkout") as checkout:
        await app.append(pool, o1, [Event("order.placed", {"n": 1})] * 2)
        traced = checkout.get_span_context()
    # A caller's own `otel` metadata is kept; an append outside any span records nothing.
    own = {"traceparent": "00-" + "a" * 32 + "-" + "b" * 16 + "-01"}
    with tracer.start_as_current_span("other"):
        await app.append(pool, o2, [Event("order.placed", {}, metadata={"otel": own})])
    await app.append(pool, o3, [Event("order.placed", {})])
    stored = {
        (r["campaign_id"], r["seq"]): r["metadata"]
        for r in await pool.fetch("SELECT campaign_id, seq, metadata FROM outbox.event_journal")
    }
    parent = stored[(o1, 1)]["otel"]["traceparent"]
    assert parent.split("-")[1:3] == [f"{traced.trace_id:032x}", f"{traced.span_id:016x}"]
    assert stored[(o1, 2)]["otel"]["traceparent"] == parent
    assert stored[(o2, 1)]["otel"] == own
    assert stored[(o3, 1)] == {}
    spans.clear()
    counts = await Worker(app, pool).run_once()
    assert counts.applied == 4
    finished = {s.name: s for s in spans.get_finished_spans()}
    batch, project = finished["outbox.batch"], finished["outbox.project"]
    assert project.parent is not None
    assert project.parent.span_id == batch.context.span_id
    assert project.attributes == {"outbox.projector": "totals", "outbox.events": 4}
    linked = sorted((link.context.trace_id, link.context.span_id) for link in project.links)
    assert linked == sorted(
        [(traced.trace_id, traced.span_id)] * 2 + [(int("a" * 32, 16), int("b" * 16, 16))]
    )
