"""What `maintenance outbox-report` shows for an operator to look at beside the queue (S33):
each projector owed work with its recorded definition and the live workers that run it, and
the campaigns stalled with no claim able to take them."""

from __future__ import annotations

from collections.abc import Sequence

from rich.table import Table

from outbox.cli.common import stdout
from outbox.ops.serving import ProjectorService
from outbox.queue.stalls import StalledCampaign

__all__ = ["render_attention"]


def render_attention(
    services: Sequence[ProjectorService], stalled: Sequence[StalledCampaign]
) -> None:
    if services:
        table = Table(
            "projector", "definition", "live workers", "paused", "attention",
            title="projectors and the live workers that run them",
        )  # fmt: skip
        for one in services:
            earlier = (
                f" (+{one.unknown_workers} of an earlier release)" if one.unknown_workers else ""
            )
            attention = "; ".join(x.split(": ", 1)[1] for x in one.problems())
            table.add_row(
                one.projector, one.fingerprint or "-", f"{one.workers}{earlier}",
                "paused" if one.paused else "", attention,
            )  # fmt: skip
        stdout.print(table)
    for campaign in stalled:
        stdout.print(campaign.describe())
