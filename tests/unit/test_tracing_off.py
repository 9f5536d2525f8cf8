"""Without OpenTelemetry's API (`pg-outbox[tracing]` not installed) tracing does nothing."""

from __future__ import annotations

import pytest

from outbox.model import StoredEvent
from outbox.obs import tracing


def test_without_the_api_nothing_is_traced(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tracing, "trace", None)
    monkeypatch.setattr(tracing, "propagate", None)
    assert tracing.carrier() is None
    ran = []
    with tracing.span("outbox.batch", attributes={"a": 1}, events=[]):
        ran.append(True)
    assert ran == [True]


def test_outside_a_span_there_is_no_context_to_record() -> None:
    assert tracing.carrier() is None


def test_events_without_a_recorded_context_give_no_link() -> None:
    from datetime import UTC, datetime

    event = StoredEvent("c", 1, "t", {}, {"otel": "not a mapping"}, datetime.now(UTC))
    assert list(tracing._links([event])) == []
