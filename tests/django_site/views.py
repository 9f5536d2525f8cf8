"""A Django view that writes its own row and appends an event in one atomic block."""

from __future__ import annotations

from django.db import connection, transaction
from django.http import HttpRequest, JsonResponse

from outbox import Event
from outbox.contrib.django import append


class Refused(Exception):
    """The view fails after both writes: the atomic block rolls back."""


@transaction.atomic
def place(request: HttpRequest, order_id: str) -> JsonResponse:
    if request.GET.get("append_first"):  # the append as the transaction's first statement
        result = append(f"order-{order_id}", [Event("order.placed", {"id": order_id})])
    with connection.cursor() as cur:
        cur.execute("INSERT INTO domain_rows (id) VALUES (%s) ON CONFLICT DO NOTHING", [order_id])
    if not request.GET.get("append_first"):
        result = append(
            f"order-{order_id}",
            [Event("order.placed", {"id": order_id})],
            idempotency_key=request.GET.get("key"),
        )
    if request.GET.get("fail"):
        raise Refused(order_id)
    return JsonResponse(
        {"first_seq": result.first_seq, "last_seq": result.last_seq, "duplicate": result.duplicate}
    )
