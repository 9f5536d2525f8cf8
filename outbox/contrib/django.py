"""Append on Django's database connection, inside `transaction.atomic()`:

    from django.db import transaction
    from outbox.contrib.django import append

    with transaction.atomic():
        order.save()
        append("order-17", [outbox.Event("order.placed", {"total": 42})])

The append runs on the connection Django uses for `using` (default: "default"), so the atomic
block covers it: the events and the view's own writes commit or roll back together. The
database must be PostgreSQL and migrated (`maintenance migrate`). Rules, results and errors are
those of `outbox.append`.
"""

from __future__ import annotations

from collections.abc import Sequence

from django.db import connections

from outbox import sync
from outbox.config import Settings
from outbox.model import AppendResult, Event

__all__ = ["append"]


def append(
    campaign_id: str,
    events: Sequence[Event],
    *,
    using: str = "default",
    expected_seq: int | None = None,
    idempotency_key: str | None = None,
    raise_on_duplicate: bool = False,
    settings: Settings | None = None,
) -> AppendResult:
    """Append on Django's connection `using`, joining its current atomic block."""
    return sync.append(
        connections[using],
        campaign_id,
        events,
        expected_seq=expected_seq,
        idempotency_key=idempotency_key,
        raise_on_duplicate=raise_on_duplicate,
        settings=settings,
    )
