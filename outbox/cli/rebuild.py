"""`maintenance projections-rebuild`: a projection reset and re-applied in place (the final
repair, S19), or, with `--as-version N`, a projector's version built beside the live one by the
catch-up engine (S30), with a progress bar or JSON progress lines."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

from outbox import db
from outbox.cli.common import (
    AppOption,
    DsnOption,
    JsonOption,
    JsonTicker,
    emit_json,
    stderr,
    stdout,
)
from outbox.cli.operator import CampaignOption, app, app_run
from outbox.errors import UsageError
from outbox.projection.app import Outbox
from outbox.projection.build import DEFAULT_CONNECTIONS, build, planned
from outbox.projection.build import Progress as BuildProgress
from outbox.projection.rebuild import RebuildResult, rebuild, versioned


@app.command("projections-rebuild")
def projections_rebuild_command(
    app_path: AppOption = None,
    dsn: DsnOption = None,
    projector: Annotated[
        list[str] | None,
        typer.Option(
            "--projector", help="Rebuild this projector (repeatable; default: all with reset=)."
        ),
    ] = None,
    campaign_id: CampaignOption = None,
    as_version: Annotated[
        int | None,
        typer.Option(
            "--as-version",
            min=2,
            help="Build this version of the one --projector beside the live one (blue/green), "
            "with the catch-up engine; the app registers it.",
            show_default=False,
        ),
    ] = None,
    connections: Annotated[
        int,
        typer.Option(
            "--connections", min=1, max=64, help="With --as-version: parallel connections."
        ),
    ] = DEFAULT_CONNECTIONS,
    max_rate: Annotated[
        float | None,
        typer.Option(
            "--max-rate",
            min=1.0,
            help="With --as-version: at most this many events/s.",
            show_default=False,
        ),
    ] = None,
    yes: Annotated[
        bool, typer.Option("--yes", help="Do it (without: say what would happen).")
    ] = False,
    as_json: JsonOption = False,
) -> None:
    """Reset projections and re-apply them from the journal in seq order (the final repair);
    with --as-version N, build version N of one projector beside the live one instead, with
    progress, resumable (run it again after a kill), then promote it
    (maintenance projector-promote)."""
    if as_version is not None:
        if len(projector or ()) != 1 or campaign_id is not None:
            raise UsageError(
                "--as-version builds one --projector, every campaign (no --campaign-id)"
            )
        _build(
            app_path, dsn, (projector or [""])[0], as_version, connections, max_rate, yes, as_json
        )
        return

    async def body(outbox_app: Outbox, pool: db.Pool) -> RebuildResult:
        with Progress(console=stderr, transient=True, disable=not yes) as bar:
            task = bar.add_task("rebuilding", total=None)
            return await rebuild(
                pool,
                outbox_app.registry,
                projectors=projector or (),
                campaign_id=campaign_id,
                apply=yes,
                progress=lambda done, total: bar.update(task, completed=done, total=total),
            )

    result = app_run(app_path, dsn, body)
    if as_json:
        emit_json("projections-rebuild", result)
    elif result.rebuilt:
        for name, n in result.applied.items():
            stdout.print(f"{name}: {n} event(s) re-applied over {result.campaigns} campaign(s)")
    else:
        stderr.print(
            f"would rebuild {', '.join(result.projectors)} over {result.campaigns} "
            "campaign(s); pass --yes to do it"
        )


def _build(
    app_path: str | None,
    dsn: str | None,
    name: str,
    version: int,
    connections: int,
    max_rate: float | None,
    yes: bool,
    as_json: bool,
) -> None:
    """`projections-rebuild --as-version`: the catch-up engine in the foreground, its progress
    as a bar (or, with --json, a line a second), its end as one line."""

    async def body(outbox_app: Outbox, pool: db.Pool) -> BuildProgress:
        chosen = versioned(outbox_app.registry, name, version)
        if not yes:
            return await planned(pool, chosen)
        with Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            TextColumn("{task.completed:,.0f}/{task.total:,.0f} events"),
            TextColumn("{task.fields[rate]:,.0f} ev/s"),
            TimeRemainingColumn(),
            console=stderr,
            transient=True,
            disable=as_json,
        ) as bar:
            task = bar.add_task(chosen.name, total=None, rate=0.0)
            ticker = JsonTicker("projections-rebuild.progress") if as_json else None

            def show(p: BuildProgress) -> None:
                bar.update(task, completed=p.events, total=p.events_total, rate=p.rate)
                if ticker is not None:
                    ticker.emit(p.summary())

            built = await build(
                pool, chosen, connections=connections, max_rate=max_rate, progress=show
            )
        return built.progress

    result = app_run(app_path, dsn, body, connections=connections + 1)
    if as_json:
        emit_json("projections-rebuild", result.summary())
    elif not yes:
        stderr.print(
            f"would build {result.projector}: {result.events_total} event(s) over "
            f"{result.campaigns_total} campaign(s) behind; pass --yes to do it"
        )
    else:
        state = "built" if result.done else "stopped"
        stdout.print(
            f"{result.projector}: {state}, {result.events} event(s) over {result.campaigns} "
            f"campaign(s) in {result.seconds:.1f} s ({result.rate:,.0f} ev/s); "
            f"{result.skipped} campaign(s) held by batches and {result.failed} failing left "
            "to the workers"
        )
