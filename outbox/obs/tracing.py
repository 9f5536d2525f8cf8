"""Tracing from an append to its apply, with OpenTelemetry when its API is installed
(`pip install 'outbox[tracing]'`; the application configures the SDK and an exporter). Without
the API, or without a span in progress, nothing happens and nothing is written.

- **Append.** An append made inside a span records that span's context in each event's
  metadata under `otel` (the carrier the global propagator fills: W3C `traceparent`, and
  `tracestate` when there is one), unless the event's metadata already has `otel`. A service in
  another language can write the same key itself.
- **Apply.** A worker's batch runs in a span `outbox.batch`; each projector call in a span
  `outbox.project` (attributes `outbox.projector`, `outbox.events`) linked to the recorded
  context of each event it applies (at most `MAX_LINKS`): the trace backend shows the append's
  trace and the apply that followed it, however long the event waited.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

try:
    from opentelemetry import propagate, trace
except ImportError:  # tracing is optional: every function below is then a no-op
    propagate = trace = None  # type: ignore[assignment]

if TYPE_CHECKING:
    from outbox.model import StoredEvent

__all__ = ["MAX_LINKS", "TRACE_METADATA", "carrier", "span"]

TRACE_METADATA = "otel"
# Links one projector span carries at most (a batch of 10,000 events links its first ones).
MAX_LINKS = 128
_SCOPE = "outbox"


def carrier() -> dict[str, str] | None:
    """The trace context in progress as a carrier for an event's metadata; None without the
    API or outside a span."""
    if trace is None or not trace.get_current_span().get_span_context().is_valid:
        return None
    found: dict[str, str] = {}
    propagate.inject(found)
    return found or None


@contextmanager
def span(
    name: str,
    *,
    attributes: Mapping[str, Any] | None = None,
    events: Sequence[StoredEvent] = (),
) -> Iterator[None]:
    """A span around the block (a no-op without the API), linked to the contexts recorded in
    `events`' metadata when it records."""
    if trace is None:
        yield
        return
    tracer = trace.get_tracer(_SCOPE)
    with tracer.start_as_current_span(name, attributes=dict(attributes or {})) as current:
        if events and current.is_recording():
            for link in _links(events):
                current.add_link(link)
        yield


def _links(events: Sequence[StoredEvent]) -> Iterator[Any]:
    seen = 0
    for event in events:
        recorded = (event.metadata or {}).get(TRACE_METADATA)
        if not isinstance(recorded, Mapping):
            continue
        context = trace.get_current_span(propagate.extract(recorded)).get_span_context()
        if context.is_valid:
            yield context
            seen += 1
            if seen >= MAX_LINKS:
                return
