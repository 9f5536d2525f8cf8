"""`maintenance projections-rebuild`: a projection reset and re-applied in place (the final
repair, S19), or, with `--as-version N`, a projector's version built beside the live one, both
by the catch-up engine (S30), with a progress bar or JSON progress lines. A rebuild of one
campaign, or of an unordered projector (markers, no checkpoint to resume from), runs campaign
by campaign (`projection.rebuild`)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Annotated

import typer
from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeRemainingColumn

from outbox import db
from outbox.cli.common import (
    AppOption,
    DsnOption,
    Interrupted,
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
from outbox.projection.builds import Progress as BuildProgress
from outbox.projection.rebuild import RebuildResult, rebuild, registered, versioned


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
    catch_up: Annotated[
        bool,
        typer.Option(
            "--catch-up",
            help="Bring the one --projector (a new one, or a version) from its checkpoints to "
            "the journal's head with the catch-up engine, resetting nothing.",
        ),
    ] = False,
    connections: Annotated[
        int,
        typer.Option("--connections", min=1, max=64, help="Parallel connections of the engine."),
    ] = DEFAULT_CONNECTIONS,
    max_rate: Annotated[
        float | None,
        typer.Option(
            "--max-rate",
            min=1.0,
            help="At most this many events/s (the engine).",
            show_default=False,
        ),
    ] = None,
    yes: Annotated[
        bool, typer.Option("--yes", help="Do it (without: say what would happen).")
    ] = False,
    as_json: JsonOption = False,
) -> None:
    """Reset projections and re-apply them from the journal in seq order (the final repair),
    on the catch-up engine: parallel, throttled, with progress, and resumed where it stopped
    when run again after a kill. With --as-version N, build version N of one projector beside
    the live one instead, then promote it (maintenance projector-promote); with --catch-up,
    bring one projector (a new one) from its checkpoints to the journal's head."""
    if as_version is not None or catch_up:
        if len(projector or ()) != 1 or campaign_id is not None or (as_version and catch_up):
            raise UsageError(
                "--as-version or --catch-up builds one --projector, every campaign (no "
                "--campaign-id)"
            )
        _build(
            app_path, dsn, (projector or [""])[0], as_version, connections, max_rate, yes, as_json
        )
        return

    async def body(outbox_app: Outbox, pool: db.Pool) -> RebuildResult:
        registry = outbox_app.registry
        names = list(projector or ())
        plan = await rebuild(pool, registry, projectors=names, campaign_id=campaign_id)
        chosen = [registry.projectors[n] for n in plan.projectors]
        engine = [p for p in chosen if campaign_id is None and (p.ordered or not p.transactional)]
        if campaign_id is not None and any(not p.transactional for p in chosen):
            raise UsageError(
                "a lease-mode projector's replay covers every campaign: no --campaign-id"
            )
        if not yes:
            return plan
        applied = dict.fromkeys(plan.projectors, 0)
        with _progress(as_json, seen) as show:
            for p in engine:  # the catch-up engine, in place (a lease-mode one: replayed)
                built = await build(
                    pool, p, connections=connections, max_rate=max_rate, progress=show,
                    in_place=True,
                )  # fmt: skip
                applied[p.name] = built.progress.events
            rest = [p.name for p in chosen if p not in engine]  # one campaign, or markers
            if rest:
                done = await rebuild(
                    pool, registry, projectors=rest, campaign_id=campaign_id, apply=True
                )
                applied.update(done.applied)
        return RebuildResult(plan.projectors, plan.campaigns, True, applied)

    # The walkers' connections, the build's own, its count's, and as many as the walkers for a
    # lease-mode projector's calls.
    seen: dict[str, BuildProgress] = {}
    with _resumable(seen):
        result = app_run(app_path, dsn, body, connections=2 * connections + 2)
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


@contextmanager
def _progress(
    as_json: bool, seen: dict[str, BuildProgress]
) -> Iterator[Callable[[BuildProgress], None]]:
    """The engine's progress as a rich bar on stderr (events done of total, rate, ETA), or,
    with --json, a JSON line at most once a second: what `build` calls after each step. A
    resumed build says so once, with what it carried; `seen` keeps each projector's latest."""
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
        tasks: dict[str, TaskID] = {}
        ticker = JsonTicker("projections-rebuild.progress") if as_json else None

        def show(p: BuildProgress) -> None:
            if p.projector not in seen and p.resumed:
                carried = (
                    f"resuming {p.projector}'s {p.kind} build where it stopped: {p.events:,} "
                    f"event(s) over {p.campaigns:,} campaign(s) carried"
                )
                if ticker is not None:
                    emit_json("projections-rebuild.resumed", p.summary())
                else:
                    stderr.print(carried)
            seen[p.projector] = p
            if p.projector not in tasks:
                tasks[p.projector] = bar.add_task(p.projector, total=p.events_total, rate=0.0)
            bar.update(tasks[p.projector], completed=p.events, total=p.events_total, rate=p.rate)
            if ticker is not None:
                ticker.emit(p.summary())

        yield show


def _build(
    app_path: str | None,
    dsn: str | None,
    name: str,
    version: int | None,
    connections: int,
    max_rate: float | None,
    yes: bool,
    as_json: bool,
) -> None:
    """`projections-rebuild --as-version` (or `--catch-up`: `version` None, the projector as
    named): the catch-up engine in the foreground, its progress as a bar (or, with --json, a
    line a second), its end as one line."""

    async def body(outbox_app: Outbox, pool: db.Pool) -> BuildProgress:
        registry = outbox_app.registry
        chosen = (
            registered(registry, name) if version is None else versioned(registry, name, version)
        )
        if not yes:
            return await planned(pool, chosen)
        with _progress(as_json, seen) as show:
            built = await build(
                pool, chosen, connections=connections, max_rate=max_rate, progress=show
            )
        return built.progress

    # The walkers' connections, the build's own and its count's.
    seen: dict[str, BuildProgress] = {}
    with _resumable(seen):
        result = app_run(app_path, dsn, body, connections=connections + 2)
    if as_json:
        emit_json("projections-rebuild", result.summary())
    elif not yes:
        stderr.print(
            f"would build {result.projector}: {result.events_total} event(s) over "
            f"{result.campaigns_total} campaign(s) behind; pass --yes to do it"
        )
    else:
        state = "built" if result.done else "stopped"
        resumed = " (resumed)" if result.resumed else ""
        stdout.print(
            f"{result.projector}: {state}{resumed}, {result.events:,} of "
            f"{result.events_total:,} event(s) over {result.campaigns:,} of "
            f"{result.campaigns_total:,} campaign(s) in {result.seconds:.1f} s "
            f"({result.rate:,.0f} ev/s); {result.left:,} event(s) on {result.skipped} "
            f"campaign(s) held by batches and {result.failed} failing left to the workers"
        )


@contextmanager
def _resumable(seen: dict[str, BuildProgress]) -> Iterator[None]:
    """An interrupted build (Ctrl-C) ends with one line: where each build stopped, and that
    running the same command again resumes it (its committed steps are kept)."""
    try:
        yield
    except KeyboardInterrupt:
        if not seen:
            raise
        where = "; ".join(
            f"{p.projector} stopped after {p.events:,}"
            + (f" of {p.events_total:,}" if p.counted else "")
            + " event(s)"
            for p in seen.values()
        )
        raise Interrupted(f"{where}: run the same command again to resume") from None
