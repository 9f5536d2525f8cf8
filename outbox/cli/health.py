"""`maintenance health`: is the outbox well (exit 0), or not (exit 1 with every reason)."""

from __future__ import annotations

from typing import Annotated

import typer

from outbox.cli.common import DsnOption, JsonOption, emit_json, settings_for, stdout
from outbox.cli.operator import app, pool_run
from outbox.errors import OutboxError
from outbox.ops.health import health
from outbox.queue.stalls import STALL_AFTER


@app.command("health")
def health_command(
    dsn: DsnOption = None,
    max_oldest_age: Annotated[
        float | None,
        typer.Option(min=0, help="Unhealthy when the oldest claimable row is older (seconds)."),
    ] = None,
    max_dead: Annotated[
        int,
        typer.Option(
            min=0,
            help="Unhealthy when more rows than this are dead (with --projector: events it is "
            "dead on).",
        ),
    ] = 0,
    max_failed: Annotated[
        int | None,
        typer.Option(
            min=0,
            help="Unhealthy when more rows than this are failed, retrying (with --projector: "
            "events it is failing on). Default: not judged.",
        ),
    ] = None,
    max_blocked: Annotated[
        int,
        typer.Option(min=0, help="Unhealthy when more campaigns than this are blocked."),
    ] = 0,
    projector: Annotated[
        str | None,
        typer.Option(
            help="Judge this recorded projector alone: unhealthy when paused, dead or failing "
            "on more events than --max-dead or --max-failed, or stalled (due work unworked "
            "for over --max-lag); other projectors' rows are not judged."
        ),
    ] = None,
    max_lag: Annotated[
        float | None,
        typer.Option(
            min=0,
            help="With --projector: seconds its due work may wait unworked "
            "(default: 10 poll intervals).",
        ),
    ] = None,
    max_stall: Annotated[
        float,
        typer.Option(
            min=0, help="Unhealthy when a campaign's due head no claim can take waits longer."
        ),
    ] = STALL_AFTER,
    as_json: JsonOption = False,
) -> None:
    """Exit 0 when the database answers, migrations are current, no more rows are dead (or
    failed) and no more campaigns blocked than allowed, no campaign stalls and the backlog is
    young; with --projector, that projector's own figures are judged instead (not paused, not
    dead or failing past the bounds, not stalled); else exit 1 with reasons."""
    settings = settings_for(dsn=dsn)
    if max_lag is not None and projector is None:
        raise OutboxError("--max-lag judges a projector: name it with --projector")
    result = pool_run(
        dsn,
        lambda pool: health(
            pool,
            max_oldest_age=max_oldest_age,
            max_dead=max_dead,
            max_blocked=max_blocked,
            park=settings.park,
            projector=projector,
            max_lag=max_lag if max_lag is not None else 10 * settings.poll_interval,
            max_stall=max_stall,
            ordered=settings.ordered,
            max_failed=max_failed,
        ),
    )
    if as_json:
        emit_json("health", result)
    elif result.healthy:
        stdout.print("healthy")
    if not result.healthy:
        raise OutboxError("unhealthy: " + "; ".join(result.reasons))
