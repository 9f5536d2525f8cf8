"""Tracing from an append to its apply, with OpenTelemetry when its API is installed
(`pip install 'pg-outbox[tracing]'`; the application configures the SDK and an exporter). Without
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

import functools
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
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
_NOTHING: AbstractContextManager[None] = nullcontext()


def carrier() -> dict[str, str] | None:
    """The trace context in progress as a carrier for an event's metadata; None without the
    API or outside a span."""
    if trace is None or not trace.get_current_span().get_span_context().is_valid:
        return None
    found: dict[str, str] = {}
    propagate.inject(found)
    return found or None


def span(
    name: str,
    *,
    attributes: Mapping[str, Any] | None = None,
    events: Sequence[StoredEvent] = (),
) -> AbstractContextManager[None]:
    """A span around the block (nothing without the API or an SDK provider), linked to the
    contexts recorded in `events`' metadata."""
    tracer = _tracer()
    if tracer is None:
        return _NOTHING
    return _recording(tracer, name, attributes, events)


@contextmanager
def _recording(
    tracer: Any, name: str, attributes: Mapping[str, Any] | None, events: Sequence[StoredEvent]
) -> Iterator[None]:
    with tracer.start_as_current_span(name, attributes=dict(attributes or {})) as current:
        if events and current.is_recording():
            for link in _links(events):
                current.add_link(link)
        yield


def _tracer() -> Any:
    """This library's tracer, or None when nothing would record (no API, or no SDK provider
    set: the API's proxy and no-op providers). A span costs ~25 us even when it records
    nothing, as much as the rest of an event's Python: skipped then."""
    if trace is None:
        return None
    provider = trace.get_tracer_provider()
    if isinstance(provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider):
        return None
    return _tracer_of(provider)


@functools.lru_cache(maxsize=4)
def _tracer_of(provider: Any) -> Any:
    return provider.get_tracer(_SCOPE)


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
